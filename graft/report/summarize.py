"""Collect the summary.json of several runs into one Markdown table: a row per single-method run, and a row
per compared method of a comparison run (its baseline in the baseline_tokens_per_s column).

python -m graft.report summarize outputs/**/summary.json [--out results/table.md]
"""

from __future__ import annotations

import argparse
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
    head = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = []
    for s in summaries:
        cells = ["-" if not isinstance(s.get(k), (int, float, str)) else fmt.format(s[k]) for k, fmt in COLUMNS]
        rows.append("| " + " | ".join(cells) + " |")
    hardware = sorted(
        {
            f"{h.get('gpu') or h.get('cpu')} ({h.get('torch_threads')} threads)"
            for h in (s.get("hardware") or {} for s in summaries)
        }
    )
    return "\n".join([head, rule, *rows, "", "Hardware: " + "; ".join(hardware)])


def _load(path: Path) -> list[dict]:
    """The table's rows of one summary.json (a run directory or the file): the summary of a single-method run,
    or each method's summary of a comparison; each with its verification budget (when the method has one)."""
    from graft.analysis import read_json

    summary = read_json(path / "summary.json" if path.is_dir() else path)
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
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report summarize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("summaries", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = table([row for p in args.summaries for row in _load(p)])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
