"""Did a change keep every method's output? Compare two roots of run directories method by method.

    python -m graft.report compare BEFORE AFTER [--out FILE.md] [--partial]

BEFORE and AFTER are each a run directory or a folder holding run directories at any depth: comparison runs
(every method and the baseline in one folder, `python run.py`'s default), single-method runs (`python run.py
method=<method> run.out_dir=<root>/<method>`), imports and peer runs alike. A row is one method of one run
directory, found at the same place under both roots (its path below the root, and the method's name; the
baseline is `ar`). Its turns are matched by prompt id and turn index, never by position: the table gives tau
before and after over the turns both sides hold, how many of those turns have the same tokens (their hash), whether
each committed the same tokens a step and verified the same nodes, the lossless verdict of each run, and the
prompts only one side has. Exit status 1 when any matched turn's tokens or steps differ or a side lacks prompts
the other has. Finished runs only: unfinished ones are named on stderr and left out, or with --partial compared
and marked "(partial)".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def sides(root: Path, partial: bool, told: list[str]) -> dict[tuple[str, str], dict]:
    """{(run path below root, method): {"turns": {(prompt id, turn): turn record}, "lossless", "partial"}}."""
    from graft.records.metrics import record_sides
    from graft.records.reader import read_summary, run_dirs, run_use, summary_records

    found: dict[tuple[str, str], dict] = {}
    for run in run_dirs([root], partial=True):
        use, unfinished = run_use(run, partial, lines=told)
        if not use:
            continue
        summary = read_summary(run)
        where = "." if run == root else run.relative_to(root).as_posix()
        for record in summary_records(run, summary):
            if record.get("status") != "ok":
                continue
            record["_method"] = summary.get("method")
            for method, side in record_sides(record).items():
                entry = found.setdefault(
                    (where, method), {"turns": {}, "lossless": lossless_of(summary, method), "partial": unfinished}
                )
                for number, turn in enumerate(side["turns"]):
                    entry["turns"][(record["id"], number)] = turn
    return found


def lossless_of(summary: dict, method: str):
    if method == "ar":
        return "-"
    per_method = summary.get("methods") or {}
    return (per_method.get(method) or summary).get("lossless")


def tau(turns: list[dict]) -> float | None:
    steps = sum(t.get("steps") or 0 for t in turns)
    return sum(t.get("step_tokens") or 0 for t in turns) / steps if steps else None


def row(label: str, before: dict, after: dict) -> tuple[str, bool]:
    """One table row and whether the method changed."""
    shared = [key for key in before["turns"] if key in after["turns"]]
    pairs = [(before["turns"][key], after["turns"][key]) for key in shared]
    hashed = [(b.get("tokens_sha256"), a.get("tokens_sha256")) for b, a in pairs]
    equal = sum(x == y for x, y in hashed if x is not None)
    known = sum(x is not None for x, _ in hashed)
    steps = lambda t: (t.get("accept_lengths"), t.get("nodes"))  # noqa: E731
    same_steps = all(steps(b) == steps(a) for b, a in pairs)
    prompts = lambda side: {key[0] for key in side["turns"]}  # noqa: E731
    only_before, only_after = sorted(prompts(before) - prompts(after)), sorted(prompts(after) - prompts(before))
    fmt = lambda value: "-" if value is None else f"{value:.4f}"  # noqa: E731
    taus = (tau([b for b, _ in pairs]), tau([a for _, a in pairs]))
    listed = lambda ids: ", ".join(ids[:3]) + (f" (+{len(ids) - 3})" if len(ids) > 3 else "") if ids else "-"  # noqa: E731
    text = (
        f"| {label} | {fmt(taus[0])} | {fmt(taus[1])} | {equal}/{known if known else 'unhashed'} | {same_steps} | "
        f"{before['lossless']} / {after['lossless']} | {listed(only_before)} | {listed(only_after)} |"
    )
    return text, equal != known or not same_steps or bool(only_before or only_after) or not pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--partial", action="store_true", help="also unfinished runs, marked (partial)")
    args = parser.parse_args(argv)
    from graft.records.reader import RecordError, none_finished

    for root in (args.before, args.after):
        if not root.exists():
            raise RecordError(f"{root}: no such file or directory (a run directory, or a folder of them)")
    told: list[str] = []
    before, after = (sides(root, args.partial, told) for root in (args.before, args.after))
    for line in dict.fromkeys(told):
        print(line, file=sys.stderr)
    if not before or not after:
        raise none_finished(f"{args.before} and {args.after}", told, args.partial)
    common = [key for key in before if key in after]
    if not common:
        raise RecordError(
            f"no method of a run directory is under both {args.before} ({', '.join(sorted(map(_label, before)))}) "
            f"and {args.after} ({', '.join(sorted(map(_label, after)))})"
        )
    lines = [
        "| method | tau before | tau after | tokens equal (turns) | same steps | lossless before / after |"
        " prompts only before | prompts only after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    changed = False
    for key in common:
        label = _label(key) + (" (partial)" if before[key]["partial"] or after[key]["partial"] else "")
        text, moved = row(label, before[key], after[key])
        lines.append(text)
        changed |= moved
    for key in [k for k in before if k not in after] + [k for k in after if k not in before]:
        print(
            f"{_label(key)}: under {args.before if key in before else args.after} only; not compared", file=sys.stderr
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    sys.exit(1 if changed else 0)


def _label(key: tuple[str, str]) -> str:
    where, method = key
    return method if where in (".", method) else f"{where}: {method}"


if __name__ == "__main__":
    main()
