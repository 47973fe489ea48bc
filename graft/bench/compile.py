"""hardware.compile against eager on this machine: the same transformers forward (fast_path=none), once
eager over the growing cache and once through torch.compile over a static cache, in one process.

    python -m graft.bench compile --out results/compile/cpu_embedded.json

Part 1, verify time: median ms of one verification of k nodes at a fixed context, the two backends
interleaved round-robin after warm-up rounds (the compiled one's first calls compile, untimed).
Part 2, decode loops: greedy ar and graft (fixed-size trees) on the built-in prompts with each backend; the
tokens must be equal, and tokens/s are medians over the prompts (each prompt run once untimed first).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from graft.cpu.threads import prefer_huge_pages

prefer_huge_pages()

import torch  # noqa: E402

from graft.bench import at_least, batch_sizes, command_parser, model_config  # noqa: E402


def parse_args(argv: list[str] | None):
    parser = command_parser("compile", __doc__)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--nodes", default="1,8,16,32")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--mode", default="default", help="hardware.compile")
    parser.add_argument("--backend", default="inductor", help="hardware.compile_backend (eager: the test's)")
    parser.add_argument("--prompts", type=int, default=4, help="built-in prompts for the decode loops (0: none)")
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_config(args.model)
    at_least(context=(args.context, 1), repeats=(args.repeats, 1), prompts=(args.prompts, 0), max_new=(args.max_new, 1))
    nodes = batch_sizes(args.nodes, least=1, example="1,8,16,32", flag="--nodes", what="tree sizes")

    from graft.backends.hf import HFBackend
    from graft.config.experiment import compose, validate

    cfg = validate(
        compose([f"model={args.model}", "hardware=cpu_plain", "hardware.fixed_size_trees=true", "logger=none"])
    )
    from graft.load.models import load_model

    loaded = load_model(cfg.model, cfg.hardware, progress=False)
    eager = loaded.target
    fast = HFBackend(eager.model, eager.tokenizer, name="compiled")
    fast.fixed_size_trees, fast.compile_mode, fast.max_context = True, args.mode, eager.max_context
    fast.compile_backend = args.backend
    backends = {"eager": eager, "compiled": fast}
    verify, seconds = verify_medians(backends, nodes, context_len=args.context, repeats=args.repeats)
    report = {
        "script": "graft/bench/compile.py",
        "argv": sys.argv[1:],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "mode": args.mode,
        "backend": args.backend,
        "context": args.context,
        "verify_median_ms": verify,
        "eager_over_compiled": {str(n): round(verify["eager"][str(n)] / verify["compiled"][str(n)], 3) for n in nodes},
        "verify_seconds": seconds,
    }
    print(json.dumps(report, indent=1), flush=True)
    if args.prompts:
        loops = decode_loops(backends, loaded, model=args.model, prompts=args.prompts, max_new=args.max_new)
        report["decode"] = loops
        print(json.dumps(loops, indent=1), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


def verify_medians(backends: dict, nodes: list[int], *, context_len: int, repeats: int) -> tuple[dict, float]:
    """Part 1: {backend: {nodes: median verify ms}} at one fixed context, the backends interleaved round-robin
    after two warm-up rounds (the compiled one's first calls compile); and the seconds those rounds took."""
    from graft.gpu_check.measure import random_tree
    from graft.tree import topology

    eager = backends["eager"]
    context = torch.randint(0, eager.vocab_size, (context_len,), generator=torch.Generator().manual_seed(0)).tolist()
    trees = {n: random_tree(n, eager.vocab_size, eager.device, seed=n) for n in nodes}  # bushy, 4 children a node
    for target in backends.values():
        target.reset(context_len + max(nodes) + 8)
        target.prefill(context)
    committed = eager.cache_len
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in nodes} for name in backends}
    started = time.perf_counter()
    for round_index in range(repeats + 2):  # two warm-up rounds: the first compiles
        for n in nodes:
            for name, target in backends.items():
                topo = topology(trees[n].parents, committed)
                t0 = time.perf_counter()
                target.verify(trees[n], topo)
                elapsed = (time.perf_counter() - t0) * 1e3
                target.cache.keep(committed, None, 0)
                if round_index >= 2:
                    times[name][n].append(elapsed)
    medians = {name: {str(n): round(statistics.median(v), 2) for n, v in per.items()} for name, per in times.items()}
    return medians, round(time.perf_counter() - started, 1)


def decode_loops(backends: dict, loaded, *, model: str, prompts: int, max_new: int) -> dict:
    """Part 2: {method: {backend: tokens/s, "equal_tokens"}} of greedy ar and graft on the first built-in prompts
    with each backend, the median over the prompts, each prompt run once untimed first."""
    from baselines.autoregressive import Autoregressive
    from graft.config.experiment import compose, validate
    from graft.data.loading import BUILTIN
    from graft.decode import generate
    from graft.registry import build_drafter

    loops = {}
    prompt_ids = [loaded.chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in BUILTIN[:prompts]]
    method_cfg = validate(compose([f"model={model}", "method=graft", "logger=none"])).method
    for name, target in backends.items():
        drafters = {"ar": Autoregressive(target), "graft": build_drafter(method_cfg, target)}
        for method, drafter in drafters.items():
            rates, outputs = [], []
            for ids in prompt_ids:
                generate(target, drafter, ids, max_new, loaded.stop_ids)  # untimed: compiles, warms up
                out = generate(target, drafter, ids, max_new, loaded.stop_ids)
                rates.append(out.step_tokens / out.decode_s)  # the first token comes from the prefill
                outputs.append(out.new_tokens)
            loops.setdefault(method, {})[name] = {"tokens_per_s": round(statistics.median(rates), 2)}
            loops[method].setdefault("outputs", []).append(outputs)
    for row in loops.values():
        outputs = row.pop("outputs")
        row["equal_tokens"] = outputs[0] == outputs[1]
    return loops


if __name__ == "__main__":
    main()
