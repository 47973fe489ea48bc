"""Tables shaped like the paper's, from run or sweep directories: one table per model and temperature,
rows = methods, columns = datasets and their mean, cells = speedup / tau; Graft's relative improvement
over EAGLE-3; the split table (share of steps per pruning stage). Markdown and LaTeX.

    python -m graft.report tables multirun/cpu_embedded [more dirs ...] [--metric speedup_wall] [--out results/cpu_embedded]
"""

from __future__ import annotations

import argparse
from pathlib import Path

ORDER = [
    "ar",
    "pld",
    "recycling",
    "suffix",
    "samd",
    "eagle3",
    "eagle3_chain",
    "eagle3_static",
    "pruned",
    "graft",
    "graft_root",
    "graft_noprune",
    "graft_tail",
    "graft_refill",
]


def build(paths: list[str], metric: str) -> tuple[str, str, object]:
    from graft.analysis import (
        RecordError,
        best_settings,
        improvement,
        is_sweep,
        method_rows,
        paper_table,
        stage_table,
        sweep_table,
    )

    rows = method_rows(paths)
    if rows.empty:
        raise RecordError(f"no run under {', '.join(map(str, paths))} has finished a prompt")
    markdown, latex = [], []
    for (model, temperature), group in rows.groupby(["model", "temperature"]):
        if is_sweep(group):
            for dataset, runs in group.groupby("dataset"):
                title = f"{model} / {dataset}, temperature {temperature:g}: {metric} / tau / nodes per step ({runs['hardware'].iloc[0]})"
                best = best_settings(runs, metric)
                note = "Best setting per method: " + "; ".join(
                    f"{b.method} {b.budget:.0f} nodes at {b.thresholds or '-'} ({getattr(b, metric):.2f}x, tau {b.tau:.2f})"
                    for b in best.itertuples()
                )
                checked = runs[runs["lossless"].notna()]
                note += f". Lossless: {int(checked['lossless'].sum())} of {len(checked)} method x setting runs."
                table = sweep_table(runs, metric, ORDER)
                markdown += [f"### {title}", "", table.to_markdown(), "", note, ""]
                latex += [f"% {title}", table.to_latex(escape=True), f"% {note}", ""]
            continue
        table = paper_table(group, metric, ORDER)
        title = f"{model}, temperature {temperature:g}: {metric} / tau ({group['hardware'].iloc[0]})"
        gain = improvement(group, "graft", "eagle3", metric)
        note = f"Graft over EAGLE-3 (mean {metric}): {gain:+.1%}. " if gain is not None else ""
        checked = group[group["lossless"].notna()]
        note += f"Lossless (greedy tokens equal the baseline's): {int(checked['lossless'].sum())} of {len(checked)} method x dataset runs."
        markdown += [f"### {title}", "", table.to_markdown(), "", note, ""]
        latex += [f"% {title}", table.to_latex(escape=True), f"% {note}", ""]
    stages = stage_table(rows, settings=is_sweep(rows))
    if not stages.empty:
        markdown += [
            "### Share of steps per pruning stage (the stage split: check@<levels> fired, or dense)",
            "",
            stages.to_markdown(floatfmt=".1%"),
            "",
        ]
    return "\n".join(markdown), "\n".join(latex), rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report tables", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--metric", default="speedup_wall", choices=["speedup_wall", "speedup_decode"])
    parser.add_argument("--out", type=Path, help="folder for tables.md, tables.tex and rows.csv")
    args = parser.parse_args(argv)
    markdown, latex, rows = build(args.paths, args.metric)
    print(markdown)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tables.md").write_text(markdown + "\n")
        (args.out / "tables.tex").write_text(latex + "\n")
        rows.drop(columns=["run"]).to_csv(args.out / "rows.csv", index=False)
        print(f"wrote {args.out}/tables.md, tables.tex, rows.csv")


if __name__ == "__main__":
    main()
