"""Did a change keep every method's output? Compare two sets of run directories method by method.

    python -m graft.report compare BEFORE_ROOT AFTER_ROOT [--out FILE.md]

Each root holds one run directory per method (`<root>/<method>/samples.jsonl` and `summary.json`, as
written by `python run.py method=<method> run.out_dir=<root>/<method> ...`). For each method present in
both, the table gives tau before and after, whether every turn's token hash is equal, whether every
step committed the same number of tokens and verified the same number of nodes, and the lossless
verdict against each run's own baseline. Exit status 1 when any method's tokens or steps differ. Finished runs
only: a method whose run is unfinished on either side is named on stderr and left out, or with `--partial`
compared, marked "(partial)".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def load(run_dir: Path) -> dict:
    from graft.records.reader import read_json, read_records

    summary = read_json(run_dir / "summary.json")
    records = read_records(run_dir)
    turns = [t for r in records if r.get("status") == "ok" for t in r["method"]["turns"]]
    return {
        "tau": summary["tau"],
        "lossless": summary["lossless"],
        "hashes": [t["tokens_sha256"] for t in turns],
        "steps": [(t["accept_lengths"], t["nodes"]) for t in turns],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--partial", action="store_true", help="also unfinished runs, marked (partial)")
    args = parser.parse_args(argv)
    from graft.records.reader import RecordError, none_finished, run_use

    for root in (args.before, args.after):
        if not root.is_dir():
            raise RecordError(f"{root}: no such directory (a root with one run directory per method)")
    methods = sorted(
        p.name
        for p in args.before.iterdir()
        if (p / "summary.json").exists() and (args.after / p.name / "summary.json").exists()
    )
    if not methods:
        raise RecordError(f"no method has a run directory with summary.json under both {args.before} and {args.after}")
    marked, told = {}, []
    for method in methods:
        sides = [run_use(root / method, args.partial, lines=told) for root in (args.before, args.after)]
        if all(use for use, _ in sides):
            marked[method] = f"{method} (partial)" if any(unfinished for _, unfinished in sides) else method
    if not marked:
        raise none_finished(f"{args.before} and {args.after}", told, args.partial)
    for line in told:
        print(line, file=sys.stderr)
    lines = [
        "| method | tau before | tau after | tokens equal (turns) | same steps | lossless before / after |",
        "|---|---|---|---|---|---|",
    ]
    changed = False
    for method, label in marked.items():
        b, a = load(args.before / method), load(args.after / method)
        equal = sum(x == y for x, y in zip(b["hashes"], a["hashes"]))
        same_steps = b["steps"] == a["steps"]
        changed |= equal != len(b["hashes"]) or len(a["hashes"]) != len(b["hashes"]) or not same_steps
        lines.append(
            f"| {label} | {b['tau']:.4f} | {a['tau']:.4f} | {equal}/{len(b['hashes'])} | {same_steps} | "
            f"{b['lossless']} / {a['lossless']} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
