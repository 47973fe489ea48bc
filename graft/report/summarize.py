"""Collect the summary.json of several runs into one Markdown table.

python -m graft.report summarize outputs/**/summary.json [--out results/table.md]
"""

from __future__ import annotations

import argparse
import json
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
        cells = ["-" if s.get(k) is None else fmt.format(s[k]) for k, fmt in COLUMNS]
        rows.append("| " + " | ".join(cells) + " |")
    hardware = sorted(
        {
            f"{s['hardware'].get('gpu') or s['hardware'].get('cpu')} ({s['hardware'].get('torch_threads')} threads)"
            for s in summaries
        }
    )
    return "\n".join([head, rule, *rows, "", "Hardware: " + "; ".join(hardware)])


def _load(path: Path) -> dict:
    """summary.json, plus the verification budget from the run.json beside it (when the method has one)."""
    summary = json.loads(path.read_text())
    run = path.parent / "run.json"
    if run.exists():
        summary.setdefault("budget", json.loads(run.read_text())["config"]["method"].get("total_tokens"))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report summarize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("summaries", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = table([_load(p) for p in args.summaries])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
