"""Side by side in one process: transformers `generate` (plain and with prompt lookup) against this
project's AR and its speculative methods, on the same prompts, greedy, every output checked against the
baseline's tokens.

    python -m graft.bench e2e [--new-tokens 128] [--repeats 1] [--out FILE.json] [--neighbour]

Prompts: 8 from EAGLE's question sets (3 MT-Bench, 2 CNN/DM, 2 HumanEval, 1 GSM8K; ../shared/data), or
the built-in prompts where those files are absent. Each system runs once untimed on the first prompt
(warm-up), then per prompt every system runs in an order that rotates with the prompt index (and with the
round: `--repeats R` runs the whole set R times). tokens/s = all new tokens / all generation seconds of a
round (prefill included, as `generate` includes it); with several rounds the table gives the median over
the rounds of the tokens/s and of each round's ratios, and the ratios' range. `--neighbour`
runs the same with one busy process beside it (a competing load on the machine), to measure the thread
and spin policy of graft/cpu/threads.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from graft.cpu.threads import choose_before_torch

# the busy neighbour starts first, so that the thread policy sees it as run.py would on a busy machine
NEIGHBOUR = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if "--neighbour" in sys.argv else None
if NEIGHBOUR:
    time.sleep(0.5)
POLICY = choose_before_torch()  # before torch loads libgomp, as run.py does

import torch  # noqa: E402

from graft.bench import at_least, command_parser, model_config  # noqa: E402
from graft.config.hydra_setup import CONFIG_DIR  # noqa: E402
from graft.hub import REPO  # noqa: E402
from graft.report.e2e import (  # noqa: E402
    NO_AMX,
    PHASES,
    PYTHON_LOOP,
    SYSTEMS,
    VARIANTS,
    print_tables,
    stored_records,
    summarise,
    variant,
)

SETS = [("eagle_mt_bench", 3), ("eagle_cnndm", 2), ("eagle_humaneval", 2), ("eagle_gsm8k", 1)]


def _group_yaml(group: str, name: str) -> dict:
    import yaml

    raw = yaml.safe_load((CONFIG_DIR / group / f"{name}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    return raw


def load_prompts(chat, data_root: str | None) -> list[tuple[str, list[int]]]:
    from graft.config.schema import DatasetConfig
    from graft.data.loading import BUILTIN
    from graft.data.loading import load_prompts as load
    from graft.schema import coerce_dataclass

    prompts = []
    for name, count in SETS:
        try:
            found = load(coerce_dataclass(DatasetConfig, _group_yaml("dataset", name), "dataset"), data_root, chat)
        except Exception as err:  # the shared data is absent: the built-in prompts stand in
            print(f"note: {name} unavailable ({type(err).__name__}); using the built-in prompts")
            prompts = []
            break
        prompts += [(f"{name}/{p.id}", p.turns[0]) for p in found[:count]]
    if len(prompts) < 8:
        prompts = [(f"builtin/{p.id}", p.turns[0]) for p in BUILTIN[:8]]
    return [(pid, chat.prompt_ids([{"role": "user", "content": text}])) for pid, text in prompts]


def hf_runner(plain, lookup: bool, new_tokens: int):
    """transformers' own generate on the unmodified model, greedy, exactly new_tokens tokens."""
    hf = plain.target.model
    kwargs = {"prompt_lookup_num_tokens": 10} if lookup else {}

    @torch.inference_mode()
    def run(ids: list[int]) -> tuple[list[int], float, None]:
        x = torch.tensor([ids])
        start = time.perf_counter()
        out = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
        return out[0, len(ids) :].tolist(), time.perf_counter() - start, None

    return run


def harness_runner(fast, model_cfg, method: str, overrides: dict, new_tokens: int):
    from graft.config.comparison import load_method_yaml
    from graft.decode import generate
    from graft.registry import build_drafter, method_config

    overrides = dict(overrides)
    python_loop = overrides.pop(PYTHON_LOOP, False)
    no_amx = overrides.pop(NO_AMX, False)
    for key in VARIANTS:
        overrides.pop(key, None)
    raw = {**load_method_yaml(method), **overrides}
    drafter = build_drafter(method_config(raw, model_cfg.draft_head, model_cfg.block_drafter), fast.target)
    lean = getattr(fast.target, "lean", None)

    def run(ids: list[int]) -> tuple[list[int], float, dict]:
        native = lean.native if lean is not None else None
        if python_loop and lean is not None:
            lean.native = None
        if no_amx and native is not None:
            native.use_amx(False)
        try:
            start = time.perf_counter()
            gen = generate(fast.target, drafter, ids, new_tokens, set())
            seconds = time.perf_counter() - start
            phases = {"steps": gen.steps, "prefill_s": gen.prefill_s}
            phases.update({f"{phase}_s": sum(getattr(gen, f"{phase}_s")) for phase in PHASES})
            return gen.new_tokens, seconds, phases
        finally:
            if lean is not None:
                lean.native = native
            if no_amx and native is not None:
                native.use_amx(True)

    return run


def parse_args(argv: list[str] | None):
    parser = command_parser("e2e", __doc__)
    parser.add_argument("--model", default="smollm2_135m", help="a config under configs/model/")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the prompt set; medians reported")
    parser.add_argument("--data-root", default=os.environ.get("GRAFT_DATA", str(REPO.parent / "shared" / "data")))
    parser.add_argument("--neighbour", action="store_true", help="run beside one busy process")
    parser.add_argument("--out", help="write the table and per-prompt records as JSON")
    parser.add_argument(
        "--tau-for",
        type=float,
        help="also give the tau each system would need, at its measured step costs, for this ratio to its target's AR",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_config(args.model)
    at_least(new_tokens=(args.new_tokens, 1), prompts=(args.prompts, 1), repeats=(args.repeats, 1))

    from graft.records.writer import hardware_info

    names = [n for n in args.systems.split(",") if n]
    fast, runners = build_runners(args, names)
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: need at least one round")
    prompts = load_prompts(fast.chat, args.data_root)[: args.prompts]
    neighbour = NEIGHBOUR
    try:
        records = time_systems(runners, prompts, names=names, repeats=args.repeats)
    finally:
        if neighbour:
            neighbour.kill()
    table = summarise(records, names, args.tau_for)
    hw = hardware_info("cpu")
    print(
        f"\n{hw['cpu']} ({hw.get('cpu_isa')}), {hw['torch_threads']} threads, {args.new_tokens} new tokens, {len(prompts)} prompts, "
        f"greedy{', one busy neighbour process' if neighbour else ''}; policy: {POLICY.reason if POLICY else 'fixed by the environment'}"
    )
    print_tables(table, args.repeats, args.tau_for)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "hardware": hw,
                    "new_tokens": args.new_tokens,
                    "neighbour": bool(neighbour),
                    "rounds": args.repeats,
                    "tau_for": args.tau_for,
                    "policy": POLICY.as_record() if POLICY else None,
                    "table": table,
                    "records": stored_records(records),
                },
                indent=2,
            )
        )


def build_runners(args, names: list[str]) -> tuple:
    """(the fast-path model, {system: runner}): the models the systems named run on, loaded once each (the
    plain model for transformers' generate, a bfloat16 copy and each hardware variant only where named)."""
    from graft.config.schema import HardwareConfig, ModelConfig
    from graft.load.models import load_model
    from graft.schema import coerce_dataclass

    model_cfg = coerce_dataclass(ModelConfig, _group_yaml("model", args.model), "model")
    fast = load_model(model_cfg, coerce_dataclass(HardwareConfig, _group_yaml("hardware", "cpu"), "hardware"))
    plain = load_model(model_cfg, HardwareConfig(name="cpu_plain", fast_path="none"))
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; allowed: {', '.join(SYSTEMS)}")
    targets = {None: fast}
    for key, (field, value, _) in VARIANTS.items():
        if any(variant(n) == key for n in names):
            hardware = coerce_dataclass(HardwareConfig, _group_yaml("hardware", "cpu"), "hardware")
            setattr(hardware, field, value)
            targets[key] = load_model(model_cfg, hardware)
    plain_bf16 = None
    if "hf_generate/bf16" in names:
        plain_bf16 = load_model(model_cfg, HardwareConfig(name="cpu_plain", fast_path="none"))
        plain_bf16.target.model.to(torch.bfloat16)
    runners = {}
    for name in names:
        spec = SYSTEMS[name]
        runners[name] = (
            hf_runner(plain_bf16 if name.endswith("/bf16") else plain, name == "hf_prompt_lookup", args.new_tokens)
            if spec is None
            else harness_runner(targets[variant(name)], model_cfg, *spec, args.new_tokens)
        )
    return fast, runners


def time_systems(runners: dict, prompts: list, *, names: list[str], repeats: int) -> list[dict]:
    """Every system on every prompt, `repeats` rounds after one untimed warm-up each, in an order that rotates
    with the prompt and the round; one record per prompt and round."""
    for run in runners.values():  # warm-up, untimed
        run(prompts[0][1][:64])
    records = []
    for round_ in range(repeats):
        for index, (pid, ids) in enumerate(prompts):
            shift = (index + round_) % len(names)
            row = {"prompt": pid, "prompt_tokens": len(ids), "round": round_}
            for name in names[shift:] + names[:shift]:
                tokens, seconds, phases = runners[name](ids)
                row[name] = {"tokens": tokens, "seconds": seconds, "phases": phases}
            records.append(row)
            rates = ", ".join(f"{n} {len(row[n]['tokens']) / row[n]['seconds']:.1f}" for n in names)
            print(f"{pid}{f' (round {round_ + 1})' if repeats > 1 else ''}: {rates}")
    return records


if __name__ == "__main__":
    main()
