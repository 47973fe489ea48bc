"""`python -m graft.gpu_check [--parts 1,2,...] [--device cuda|cpu] [--quick] [--out FILE]`: the device check
(graft/gpu_check/__init__.py says what each part does)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Callable

import torch

import graft.gpu_check
from graft.gpu_check.batched import part_batched
from graft.gpu_check.compiled import part_compiled
from graft.gpu_check.dense import part_llama8b
from graft.gpu_check.environment import part_environment
from graft.gpu_check.goals import failed, goal_rows, goals_text
from graft.gpu_check.lossless import part_lossless, part_lossless_sampled
from graft.gpu_check.moe import part_head235, part_moe_layers
from graft.gpu_check.plan import CPU, FULL, QUICK
from graft.gpu_check.report import Context, Interrupted, Report
from graft.gpu_check.syncs import part_host_syncs
from graft.run.commands import one_line_errors
from graft.schema import ConfigError

PARTS: dict[int, Callable[[Context, dict], None]] = {
    1: part_environment,
    2: part_lossless,
    3: part_host_syncs,
    4: part_llama8b,
    5: part_moe_layers,
    6: part_head235,
    7: part_compiled,
    8: part_lossless_sampled,
    9: part_batched,
}


def parse_parts(text: str) -> list[int]:
    parts = sorted({int(p) for p in text.split(",") if p.strip()})
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown parts {unknown}; parts are {sorted(PARTS)}")
    return parts


@one_line_errors  # bad input is one line and exit 2, as in run.py (graft/run/commands.py)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m graft.gpu_check",
        description=graft.gpu_check.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="outputs/gpu_check.json")
    parser.add_argument("--parts", type=parse_parts, default=sorted(PARTS), help="e.g. 1,2,6 (default: all)")
    parser.add_argument(
        "--budget-s", type=float, help="soft total time limit, at most the parts' budgets (plan.py; their sum if unset)"
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few methods (for the CPU test)")
    # without --quick on a CPU: the GPU run's tree sizes, contexts and goals at small shapes (plan.py: CPU)
    args = parser.parse_args(argv)
    if args.budget_s is not None and not 0 < args.budget_s < float("inf"):
        raise ConfigError(f"--budget-s {args.budget_s:g} is not allowed; expected seconds > 0 (unset: the parts' sum)")
    if Path(args.out).is_dir():
        raise ConfigError(
            f"--out {args.out} is a folder; the report is a file, e.g. --out {Path(args.out) / 'gpu_check.json'}"
        )

    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the node: fail fast instead of retrying the Hub
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device; use --device cpu --quick")
    device = torch.device(args.device)
    if args.quick and device.type == "cpu":
        # tiny shapes gain nothing from threads, and on a busy machine their spin-waits cost 5-10x (measured: 54 s
        # against 8 s for the whole quick run with 2 threads on 2 loaded cores)
        torch.set_num_threads(1)
    header = {
        "script": "graft.gpu_check",
        "argv": sys.argv[1:] if argv is None else argv,
        "device": str(device),
        "quick": args.quick,
        "plan": "QUICK" if args.quick else "CPU" if device.type == "cpu" else "FULL",
    }
    plan = QUICK if args.quick else CPU if device.type == "cpu" else FULL
    budgets = {n: plan.part_budget_s[n] for n in args.parts}
    header["part_budget_s"] = budgets
    total = sum(budgets.values()) if args.budget_s is None else min(args.budget_s, sum(budgets.values()))
    report = Report(Path(args.out), total, header)
    ctx = Context(plan=plan, device=device, quick=args.quick, report=report)

    def on_term(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    try:
        for number, part in PARTS.items():
            if number in args.parts:
                later = sum(b for n, b in budgets.items() if n > number)
                report.run(number, lambda result, part=part: part(ctx, result), budgets[number], reserved_s=later)
            else:
                report.skip(number, "not selected (--parts)")
    except Interrupted:
        report.data["interrupted"] = True
        for number in PARTS:
            if str(number) not in report.data["parts"]:
                report.skip(number, "SIGTERM (the run's time limit) before it started")
    report.finish()
    print(json.dumps(report.data["summary"], indent=1))
    rows = goal_rows(report.data["parts"], str(device))
    print(goals_text(rows))
    print(f"wrote {args.out} in {report.elapsed():.1f} s")
    missed = failed(rows)
    if missed:
        print(f"goals failed: {'; '.join(missed)}")
    return 1 if "failed" in report.data["summary"] or missed else 0  # parts ok or skipped, no goal failed: 0


if __name__ == "__main__":
    sys.exit(main())
