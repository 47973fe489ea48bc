"""Collect the summary.json of several runs into one Markdown table.

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


def _load(path: Path) -> dict:
    """summary.json, plus the verification budget from the run.json beside it (when the method has one)."""
    from graft.analysis import read_json

    summary = read_json(path / "summary.json" if path.is_dir() else path)
    run = (path if path.is_dir() else path.parent) / "run.json"
    if run.exists():
        method = (read_json(run).get("config") or {}).get("method") or {}
        summary.setdefault("budget", method.get("total_tokens"))
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
