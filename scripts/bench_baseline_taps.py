"""What the baseline paid for a drafter's hidden taps: the autoregressive baseline with and without the
EAGLE head's taps, in one process, on the same prompts, interleaved.

    python scripts/bench_baseline_taps.py [--prompts 8] [--max-new-tokens 128] [--repeats 3] [overrides ...]

Before the backend interface, taps were global state on the shared target, set for the method, so the
baseline's forwards computed and concatenated them too; now the loop asks for a drafter's taps on its
own forwards only. `with_taps` reproduces the old baseline exactly (the same loop, a drafter that
proposes nothing but declares the head's taps). Tokens/s are per prompt (prefill included), the order
alternates per prompt after an untimed warm-up, and the figure is the median over prompts and repeats
of the per-prompt ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GOMP_SPINCOUNT", "100000000")  # as run.py does, before torch loads libgomp
from graft.cpu.threads import prefer_huge_pages  # noqa: E402  (imports no torch)

prefer_huge_pages()  # as run.py asks, before torch allocates
os.environ.setdefault("WANDB_MODE", "disabled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the rates and ratios here (JSON)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model=tiny_llama")
    args = parser.parse_args()

    from baselines.autoregressive import Autoregressive
    from graft.config import compose, validate
    from graft.data import load_prompts
    from graft.decode import generate
    from graft.models import load_model
    from graft.registry import build_drafter

    cfg = validate(compose(["method=eagle3", "logger=none", *args.overrides]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    taps = build_drafter(cfg.method, model.target).needs.taps

    class WithTaps(Autoregressive):
        needs = type(Autoregressive.needs)(taps=taps)

    sides = {"without_taps": Autoregressive(model.target), "with_taps": WithTaps(model.target)}
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)[: args.prompts]
    ids = [model.chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    for drafter in sides.values():  # warm-up, untimed
        generate(model.target, drafter, ids[0], 16, model.stop_ids)
    rates = {name: [] for name in sides}
    ratios = []
    for repeat in range(args.repeats):
        for k, prompt in enumerate(ids):
            order = list(sides) if (k + repeat) % 2 == 0 else list(reversed(sides))
            rate = {}
            for name in order:
                start = time.perf_counter()
                out = generate(model.target, sides[name], prompt, args.max_new_tokens, model.stop_ids)
                rate[name] = len(out.new_tokens) / (time.perf_counter() - start)
                rates[name].append(rate[name])
            ratios.append(rate["without_taps"] / rate["with_taps"])
    print(
        f"model {cfg.model.name}, taps {[(t.layer, t.where) for t in taps]}, {len(ids)} prompts x {args.repeats} repeats, "
        f"{args.max_new_tokens} new tokens, hardware {cfg.hardware.name} ({cfg.hardware.fast_path})"
    )
    for name, values in rates.items():
        print(f"  {name:13s} tokens/s median {statistics.median(values):.2f}")
    print(
        f"  without / with taps: median per-prompt ratio {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f})"
    )
    if args.out is not None:
        from graft.records import hardware_info

        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "command": " ".join(sys.argv),
            "hardware": hardware_info(str(model.target.device)),
            "model": cfg.model.name,
            "fast_path": cfg.hardware.fast_path,
            "taps": [[t.layer, t.where] for t in taps],
            "prompts": len(ids),
            "repeats": args.repeats,
            "new_tokens": args.max_new_tokens,
            "tokens_per_s": rates,
            "without_over_with": ratios,
            "median_ratio": statistics.median(ratios),
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
