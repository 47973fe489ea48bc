"""Collect the summary.json of several runs into one Markdown table: a row per single-method run, and a row
per compared method of a comparison run (its baseline in the baseline_tokens_per_s column).

python -m graft.report summarize outputs/**/summary.json [--out results/table.md] [--partial]

Finished runs only (summary.json's `complete` record verifies against the run's records); an unfinished one is
named on stderr and skipped, or with `--partial` given a row whose method is marked "(partial)".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COLUMNS = [
    ("model", "{}"),
    ("method", "{}"),
    ("dataset", "{}"),
    ("budget", "{}"),
    ("n_prompts", "{}"),
    ("tau", "{:.2f}"),
    ("tokens_per_s", "{:.1f}"),
    ("baseline_tokens_per_s", "{:.1f}"),
    ("speedup_wall", "{:.3f}"),
    ("speedup_decode", "{:.3f}"),
    ("avg_nodes_per_step", "{:.1f}"),
    ("retrieval_share", "{:.1%}"),
    ("graft_overhead", "{:.1%}"),
    ("loop_overhead", "{:.1%}"),
    ("lossless", "{}"),
]


def table(summaries: list[dict]) -> str:
    """The Markdown table; with a `speedup_wall_repeats` column (mean (min-max) over run.repeats passes) when
    some run repeated its comparison."""
    repeated = any(s.get("repeats") for s in summaries)
    names = [name for name, _ in COLUMNS] + (["speedup_wall_repeats"] if repeated else [])
    head = "| " + " | ".join(names) + " |"
    rule = "|" + "|".join("---" for _ in names) + "|"
    rows = []
    for s in summaries:
        cells = ["-" if not isinstance(s.get(k), (int, float, str)) else fmt.format(s[k]) for k, fmt in COLUMNS]
        if repeated:
            spread = (s.get("repeats") or {}).get("speedup_wall") or {}
            cells.append(
                "-"
                if spread.get("mean") is None
                else f"{spread['mean']:.3f} ({spread['min']:.3f}-{spread['max']:.3f}), R={s['repeats']['R']}"
            )
        rows.append("| " + " | ".join(cells) + " |")
    hardware = sorted(
        {
            f"{h.get('gpu') or h.get('cpu')} ({h.get('torch_threads')} threads)"
            for h in (s.get("hardware") or {} for s in summaries)
        }
    )
    return "\n".join([head, rule, *rows, "", "Hardware: " + "; ".join(hardware)])


def _load(path: Path, partial: bool = False, lines: list | None = None) -> list[dict]:
    """The table's rows of one summary.json (a run directory or the file): the summary of a single-method run,
    or each method's summary of a comparison; each with its verification budget (when the method has one).
    None of an unfinished run (named in `lines`), unless `partial` (graft/records/reader.py: run_use); then its
    methods say so."""
    from graft.records.reader import RecordError, read_json, run_use

    if not path.is_dir() and path.name != "summary.json":  # run.json, samples.jsonl: a run's other files
        raise RecordError(f"{path}: not a summary; give a run's folder or its summary.json")
    summary = read_json(path / "summary.json" if path.is_dir() else path)
    use, unfinished = run_use(path if path.is_dir() else path.parent, partial, summary, lines)
    if not use:
        return []
    if summary.get("kind") == "comparison":
        shared = {key: summary.get(key) for key in ("model", "dataset", "hardware")}  # where a method's lacks them
        rows = [
            {**shared, **row, "method": row.get("method", name)} for name, row in (summary.get("methods") or {}).items()
        ]
    else:
        rows = [summary]
    run = (path if path.is_dir() else path.parent) / "run.json"
    recorded = (read_json(run).get("config") or {}).get("method") or {} if run.exists() else {}
    for row in rows:
        budget = (row.get("method_config") or {}).get("total_tokens")
        if budget is None and summary.get("kind") != "comparison":
            budget = recorded.get("total_tokens")  # older summaries without method_config
        row.setdefault("budget", budget)
        if unfinished:
            row["method"] = f"{row.get('method')} (partial)"
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report summarize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("summaries", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--partial", action="store_true", help="also unfinished runs, marked (partial)")
    args = parser.parse_args(argv)
    from graft.records.reader import none_finished

    lines: list[str] = []
    rows = [row for p in args.summaries for row in _load(p, args.partial, lines)]
    if not rows:
        raise none_finished(", ".join(map(str, args.summaries)), lines, args.partial)
    for line in lines:
        print(line, file=sys.stderr)
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
