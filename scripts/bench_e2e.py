"""Side by side in one process: transformers `generate` (plain and with prompt lookup) against this
project's AR and its speculative methods, on the same prompts, greedy, every output checked against the
baseline's tokens.

    python scripts/bench_e2e.py [--new-tokens 128] [--repeats 1] [--out FILE.json] [--neighbour]

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

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graft.cpu.threads import choose_before_torch  # noqa: E402

# the busy neighbour starts first, so that the thread policy sees it as run.py would on a busy machine
NEIGHBOUR = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if "--neighbour" in sys.argv else None
if NEIGHBOUR:
    time.sleep(0.5)
POLICY = choose_before_torch()  # before torch loads libgomp, as run.py does

import torch  # noqa: E402

SETS = [("eagle_mt_bench", 3), ("eagle_cnndm", 2), ("eagle_humaneval", 2), ("eagle_gsm8k", 1)]
PYTHON_LOOP = "_python_loop"  # not a method key: the system runs with the target's native loop off
ONEDNN = "_onednn"  # not a method key: the system runs on a second target whose products are oneDNN's
BF16 = "_packed_bf16"  # not a method key: the system runs on a second target, fast_path=packed_bf16
NO_AMX = "_no_amx"  # not a method key: the system runs with graft/cpu/native's AMX tiles off (the dot products)
# trim auto on the packed_bf16 target reads that target's costs (scripts/cost_profile.py hardware.fast_path=packed_bf16)
BF16_PROFILE = {"cost_profile": "results/cost_model/cost_profile_amx_packed_bf16.json"}
VARIANTS = {ONEDNN: ("product_kernel", "onednn", "ar/onednn"), BF16: ("fast_path", "packed_bf16", "ar/bf16")}
SYSTEMS = {  # name -> method config and overrides (None: a transformers system)
    "hf_generate": None,
    "hf_prompt_lookup": None,
    # transformers' generate on the model cast to bfloat16 (oneDNN's bfloat16 products: AMX where the CPU has it)
    "hf_generate/bf16": None,
    "ar": ("ar", {}),
    # the target with its products' weights in bfloat16 (hardware.fast_path=packed_bf16: AMX tiles where the CPU
    # has them); its systems are checked against ar/bf16, a different float target from ar's
    "ar/bf16": ("ar", {BF16: True}),
    "graft@8/bf16": ("graft", {"total_tokens": 8, BF16: True}),
    "graft@16/bf16": ("graft", {"total_tokens": 16, BF16: True}),
    "graft@24/bf16": ("graft", {"total_tokens": 24, BF16: True}),
    "graft@32/bf16": ("graft", {"total_tokens": 32, BF16: True}),
    "graft@16/refill/bf16": ("graft", {"total_tokens": 16, "refill": True, BF16: True}),
    "graft@24/refill/bf16": ("graft", {"total_tokens": 24, "refill": True, BF16: True}),
    "graft@32/refill/bf16": ("graft", {"total_tokens": 32, "refill": True, BF16: True}),
    "eagle3@4/bf16": ("eagle3", {"total_tokens": 4, BF16: True}),
    "eagle3@8/bf16": ("eagle3", {"total_tokens": 8, BF16: True}),
    "eagle3@16/bf16": ("eagle3", {"total_tokens": 16, BF16: True}),
    "eagle3@24/bf16": ("eagle3", {"total_tokens": 24, BF16: True}),
    "pld/bf16": ("pld", {BF16: True}),
    "graft@16/recycling+pld/bf16": ("graft", {"total_tokens": 16, "retrieval": ["recycling", "pld"], BF16: True}),
    "graft_auto@16/bf16": ("graft_auto", {"total_tokens": 16, BF16: True, **BF16_PROFILE}),
    "graft_auto@24/bf16": ("graft_auto", {"total_tokens": 24, BF16: True, **BF16_PROFILE}),
    "graft_auto@32/bf16": ("graft_auto", {"total_tokens": 32, BF16: True, **BF16_PROFILE}),
    # before the AMX tiles: the bfloat16 head's products on vdpbf16ps (the float32 target is the same either way)
    "graft@6/refill/no_amx": ("graft", {"total_tokens": 6, "refill": True, NO_AMX: True}),
    "graft@16/no_amx": ("graft", {"total_tokens": 16, NO_AMX: True}),
    "eagle3@4/no_amx": ("eagle3", {"total_tokens": 4, NO_AMX: True}),
    "pld": ("pld", {}),
    "graft@8": ("graft", {"total_tokens": 8}),
    "graft@16": ("graft", {"total_tokens": 16}),
    "eagle3@8": ("eagle3", {"total_tokens": 8}),
    # the dense tree at small budgets: EagleSource drafts only the nodes such a budget can keep (Split.widest_useful)
    "eagle3@4": ("eagle3", {"total_tokens": 4}),
    "eagle3@6": ("eagle3", {"total_tokens": 6}),
    "graft@6": ("graft", {"total_tokens": 6}),
    "graft@4": ("graft", {"total_tokens": 4}),
    # EAGLE-3 at small, shallow dense trees: the settings where drafting costs least here
    "eagle3@6/d3k3": ("eagle3", {"total_tokens": 6, "depth": 3, "top_k": 3}),
    "eagle3@4/d2k2": ("eagle3", {"total_tokens": 4, "depth": 2, "top_k": 2}),
    "eagle3@4/d2k2/bf16_head": ("eagle3", {"total_tokens": 4, "depth": 2, "top_k": 2, "head_dtype": "bfloat16"}),
    # the draft head in bfloat16 (half the bytes per level; the target still verifies in float32), and
    # EAGLE-3's best setting measured on this CPU: a small, shallow dense tree
    "graft@16/bf16_head": ("graft", {"total_tokens": 16, "head_dtype": "bfloat16"}),
    "graft@6/bf16_head": ("graft", {"total_tokens": 6, "head_dtype": "bfloat16"}),
    "graft@8/bf16_head": ("graft", {"total_tokens": 8, "head_dtype": "bfloat16"}),
    "eagle3@6/d3k3/bf16_head": ("eagle3", {"total_tokens": 6, "depth": 3, "top_k": 3, "head_dtype": "bfloat16"}),
    "dflash": ("dflash", {}),
    # Token Recycling's table started from the prefill's top-k at every prompt position (the paper's form)
    "graft@16/prefill_cold_start": ("graft", {"total_tokens": 16, "cold_start": "prefill"}),
    "recycling": ("recycling", {}),
    # the budget Token Recycling leaves unfilled (unknown table entries) filled by prompt lookup after it
    "graft@8/recycling+pld": ("graft", {"total_tokens": 8, "retrieval": ["recycling", "pld"]}),
    "recycling/prefill_cold_start": ("recycling", {"cold_start": "prefill"}),
    # the budget retrieval leaves unfilled given to the draft's next-best candidates (method.refill)
    "graft@8/refill": ("graft", {"total_tokens": 8, "refill": True}),
    "graft@6/refill": ("graft", {"total_tokens": 6, "refill": True}),
    "graft@12/refill": ("graft", {"total_tokens": 12, "refill": True}),
    "graft@8/refill/bf16_head": ("graft", {"total_tokens": 8, "refill": True, "head_dtype": "bfloat16"}),
    # a frontier no wider than the draft can keep (top-k 7 of 8 nodes, 5 of 6): head levels of fewer rows
    "graft@8/k7/refill": ("graft", {"total_tokens": 8, "refill": True, "top_k": 7}),
    "graft@6/k5/refill": ("graft", {"total_tokens": 6, "refill": True, "top_k": 5}),
    # the refilled united tree cut each step to the most expected tokens per ms (trim auto), at most N nodes
    "graft_auto@8": ("graft_auto", {"total_tokens": 8}),
    "graft_auto@12": ("graft_auto", {"total_tokens": 12}),
    "graft_auto@16": ("graft_auto", {"total_tokens": 16}),
    "graft@8/k7": ("graft", {"total_tokens": 8, "top_k": 7}),
    # the target's layer loop in Python (the native C++ loop switched off for this system only)
    "ar/python": ("ar", {PYTHON_LOOP: True}),
    "graft@8/python": ("graft", {"total_tokens": 8, PYTHON_LOOP: True}),
    # the target's products through oneDNN instead of graft/cpu/native's panel kernel (a second target, same weights)
    "ar/onednn": ("ar", {ONEDNN: True}),
    "graft@6/onednn": ("graft", {"total_tokens": 6, ONEDNN: True}),
    "graft@6/bf16_head/onednn": ("graft", {"total_tokens": 6, "head_dtype": "bfloat16", ONEDNN: True}),
    # the head in float32 whatever method.head_dtype=auto picks (bfloat16 on an AVX2 build)
    "graft@6/f32_head": ("graft", {"total_tokens": 6, "head_dtype": "float32"}),
    "graft@8/refill/f32_head": ("graft", {"total_tokens": 8, "refill": True, "head_dtype": "float32"}),
    "eagle3@4/f32_head": ("eagle3", {"total_tokens": 4, "head_dtype": "float32"}),
}


PHASES = ("draft", "verify", "other")  # a step's phases, as graft/decode.py times them


def variant(name: str) -> str | None:
    """The second target a system runs on (ONEDNN, BF16), or None: the default fast target."""
    return next((key for key in VARIANTS if SYSTEMS[name] and SYSTEMS[name][1].get(key)), None)


def _group_yaml(group: str, name: str) -> dict:
    import yaml

    from graft.config import CONFIG_DIR

    raw = yaml.safe_load((CONFIG_DIR / group / f"{name}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    return raw


def load_prompts(chat, data_root: str | None) -> list[tuple[str, list[int]]]:
    from graft.config import DatasetConfig
    from graft.data import BUILTIN
    from graft.data import load_prompts as load
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
    from graft.config import load_method_yaml
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="a config under configs/model/")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the prompt set; medians reported")
    parser.add_argument("--data-root", default=os.environ.get("GRAFT_DATA", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--neighbour", action="store_true", help="run beside one busy process")
    parser.add_argument("--out", help="write the table and per-prompt records as JSON")
    parser.add_argument(
        "--tau-for",
        type=float,
        help="also give the tau each system would need, at its measured step costs, for this ratio to its target's AR",
    )
    args = parser.parse_args()

    from graft.config import HardwareConfig, ModelConfig
    from graft.models import load_model
    from graft.records import hardware_info
    from graft.schema import coerce_dataclass

    model_cfg = coerce_dataclass(ModelConfig, _group_yaml("model", args.model), "model")
    fast = load_model(model_cfg, coerce_dataclass(HardwareConfig, _group_yaml("hardware", "cpu"), "hardware"))
    plain = load_model(model_cfg, HardwareConfig(name="cpu_plain", fast_path="none"))
    names = [n for n in args.systems.split(",") if n]
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
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: need at least one round")
    prompts = load_prompts(fast.chat, args.data_root)[: args.prompts]
    neighbour = NEIGHBOUR
    try:
        for run in runners.values():  # warm-up, untimed
            run(prompts[0][1][:64])
        records = []
        for round_ in range(args.repeats):
            for index, (pid, ids) in enumerate(prompts):
                shift = (index + round_) % len(names)
                row = {"prompt": pid, "prompt_tokens": len(ids), "round": round_}
                for name in names[shift:] + names[:shift]:
                    tokens, seconds, phases = runners[name](ids)
                    row[name] = {"tokens": tokens, "seconds": seconds, "phases": phases}
                records.append(row)
                rates = ", ".join(f"{n} {len(row[n]['tokens']) / row[n]['seconds']:.1f}" for n in names)
                print(f"{pid}{f' (round {round_ + 1})' if args.repeats > 1 else ''}: {rates}")
    finally:
        if neighbour:
            neighbour.kill()
    table = summarise(records, names, args.tau_for)
    hw = hardware_info("cpu")
    print(
        f"\n{hw['cpu']} ({hw.get('cpu_isa')}), {hw['torch_threads']} threads, {args.new_tokens} new tokens, {len(prompts)} prompts, "
        f"greedy{', one busy neighbour process' if neighbour else ''}; policy: {POLICY.reason if POLICY else 'fixed by the environment'}"
    )
    print("tokens/s = new tokens / generation seconds (prefill included), summed over prompts")
    if args.repeats > 1:
        print(f"medians over {args.repeats} rounds; x AR's range over the rounds in brackets")
    print("x its target's AR: against ar/bf16 (ar/onednn) for the systems on that target, where it ran")
    print("| system | tokens/s | x HF generate | x this project's AR | x its target's AR | equal to its baseline |")
    print("|---|---|---|---|---|---|")
    for row in table:
        spread = row.get("x_ar_range")
        spread = f" [{spread[0]:.2f}-{spread[1]:.2f}]" if spread else ""
        own = f"{row['x_own_ar']:.2f}" if "x_own_ar" in row else "-"
        print(
            f"| {row['system']} | {row['tokens_per_s']:.1f} | {row.get('x_hf', float('nan')):.2f} | "
            f"{row.get('x_ar', float('nan')):.2f}{spread} | {own} | {row['equal']} |"
        )
    print("\nwhere a step's time goes (means per step; tau = tokens per step after the first, graft/decode.py)")
    needed = f" tau for {args.tau_for:g}x its AR |" if args.tau_for else ""
    print(f"| system | tau | draft ms | verify ms | other ms | ms per token |{needed}")
    print("|---|---|---|---|---|---|" + ("---|" if needed else ""))
    for row in table:
        if "tau" in row:
            print(
                f"| {row['system']} | {row['tau']:.2f} | {row['draft_ms']:.2f} | {row['verify_ms']:.2f} | "
                f"{row['other_ms']:.2f} | {row['ms_per_token']:.2f} |"
                + (f" {row['tau_needed']:.2f} |" if needed and "tau_needed" in row else " - |" if needed else "")
            )
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
                    "records": [
                        {
                            k: (
                                v
                                if k in ("prompt", "prompt_tokens", "round")
                                else {"n": len(v["tokens"]), "seconds": v["seconds"], "phases": v["phases"]}
                            )
                            for k, v in r.items()
                        }
                        for r in records
                    ],
                },
                indent=2,
            )
        )


def tau_needed(step_ms: float, ar_ms_per_token: float, ratio: float) -> float:
    """The tokens a step must commit for `ratio` x AR's tokens/s at a step cost of `step_ms` (draft + verify +
    other), AR committing one token every `ar_ms_per_token`: ratio = tau ar_ms_per_token / step_ms."""
    return ratio * step_ms / ar_ms_per_token


def summarise(records: list[dict], names: list[str], tau_for: float | None = None) -> list[dict]:
    """Per system: tokens/s over all prompts of a round, ratios to HF generate and to AR within the round, and
    whether every output equals its baseline's (transformers systems against hf_generate, this project's
    against ar, or against ar/onednn (ar/bf16) for the systems on the oneDNN (packed_bf16) target where it ran,
    hf_generate/bf16 against nothing: a different summation
    order is a different float target). Over several rounds (records' `round`) the medians, and x AR's range.
    With `tau_for`, each of this project's systems' `tau_needed`: the tau that would give it `tau_for` x its
    target's AR at its measured step costs (tau_needed)."""
    rounds = sorted({r.get("round", 0) for r in records})
    rates = []  # per round: system -> tokens/s
    for round_ in rounds:
        taken = [r for r in records if r.get("round", 0) == round_]
        rates.append({n: sum(len(r[n]["tokens"]) for r in taken) / sum(r[n]["seconds"] for r in taken) for n in names})
    rows = []
    for name in names:
        base = "hf_generate" if SYSTEMS[name] is None else "ar"
        if variant(name) is not None and VARIANTS[variant(name)][2] in names:
            base = VARIANTS[variant(name)][2]
        if name == "hf_generate/bf16":
            base = None
        equal = all(r[name]["tokens"] == r[base]["tokens"] for r in records) if base in names else None
        row = {"system": name, "tokens_per_s": statistics.median(rate[name] for rate in rates), "equal": equal}
        if "hf_generate" in names:
            row["x_hf"] = statistics.median(rate[name] / rate["hf_generate"] for rate in rates)
        if "ar" in names:
            per_round = [rate[name] / rate["ar"] for rate in rates]
            row["x_ar"] = statistics.median(per_round)
            if len(rates) > 1:
                row["x_ar_range"] = [min(per_round), max(per_round)]
        own = VARIANTS[variant(name)][2] if variant(name) is not None else "ar"
        if SYSTEMS[name] is not None and own != "ar" and own in names:  # against the AR of its own target
            row["x_own_ar"] = statistics.median(rate[name] / rate[own] for rate in rates)
        if SYSTEMS[name] is not None:
            row.update(step_split([r[name] for r in records]))
            if tau_for and own in names and name != own:
                step_ms = sum(row[f"{phase}_ms"] for phase in PHASES)
                row["tau_needed"] = tau_needed(step_ms, step_split([r[own] for r in records])["ms_per_token"], tau_for)
        rows.append(row)
    return rows


def step_split(runs: list[dict]) -> dict:
    """Over a system's runs: tokens per step (tau, the first token from the prefill excluded), the mean
    milliseconds per step of each phase, and the decode milliseconds per token (prefill excluded)."""
    steps = sum(run["phases"]["steps"] for run in runs)
    step_tokens = sum(len(run["tokens"]) - 1 for run in runs)
    decode_s = sum(run["seconds"] - run["phases"]["prefill_s"] for run in runs)
    split = {f"{phase}_ms": 1e3 * sum(run["phases"][f"{phase}_s"] for run in runs) / max(steps, 1) for phase in PHASES}
    return {"tau": step_tokens / max(steps, 1), **split, "ms_per_token": 1e3 * decode_s / max(step_tokens, 1)}


if __name__ == "__main__":
    main()
