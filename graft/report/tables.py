"""Tables shaped like the paper's, from run or sweep directories: one table per model and temperature,
rows = methods, columns = datasets and their mean, cells = speedup / tau; Graft's relative improvement
over EAGLE-3; the split table (share of steps per pruning stage). Markdown and LaTeX. A speedup carries its
95% interval over prompts ("1.52x [1.41, 1.63] / 2.31") where the run's records give one, from 10 prompts on
(graft/analysis/stats.py: MIN_N_FOR_INTERVAL; fewer: "1.52x (n=8) / 2.31"): summary.json's `intervals`, else computed
from samples.jsonl. A run of run.repeats > 1 adds a table of each ratio's mean and range over the repeats.

Finished runs only: an unfinished one (no verifying `complete` record in summary.json) is named on stderr and
skipped, or with `--partial` shown, its rows marked "(partial)". Runs that would share a cell but differ in a
setting their numbers depend on (run.max_new_tokens, the method's config, the hardware, ...) are not averaged:
their rows are labelled with it ("graft (max_new_tokens=64)") and a line under the table names it; rows.csv's
`settings` column holds those settings alone ("run.max_new_tokens=64"), empty where nothing splits a cell.
With --out, tables.md and tables.tex begin with the command that writes them again (`python -m graft.report
render` reruns it for every folder of results/, and --check fails where the committed files trail the code).

`--by category`: also, per model, temperature and dataset, rows = the dataset's categories and "all", columns =
methods, cells "speedup [low, high] / tau [low, high]"; with --out, categories.csv holds every interval (one row
per run, method, category and metric: value, low, high, n).

    python -m graft.report tables multirun/cpu_embedded [more dirs ...] [--metric speedup_wall] [--by category] [--partial] [--out results/cpu_embedded]
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


def ordered(labels) -> list[str]:
    """Row labels in ORDER of their method ("graft (max_new_tokens=64)" is graft's), then by label."""
    import re

    rank = {m: i for i, m in enumerate(ORDER)}
    numbers = lambda label: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label)]  # noqa: E731  64 < 128
    return sorted(set(labels), key=lambda label: (rank.get(label.split(" (")[0], len(ORDER)), numbers(label)))


def build(paths: list[str], metric: str, partial: bool = False) -> tuple[str, str, object]:
    from graft.analysis.batch import batch_rows, batch_series, batch_table
    from graft.analysis.tables import (
        best_settings,
        improvement,
        is_sweep,
        method_rows,
        paper_table,
        repeat_table,
        split_settings,
        stage_table,
        sweep_table,
    )
    from graft.records.reader import RecordError

    rows = method_rows(paths, intervals=True, partial=partial)
    if rows.empty:
        raise RecordError(f"no run under {', '.join(map(str, paths))} has finished a prompt")
    rows, notes = split_settings(rows)
    order = ordered(rows["method"])
    markdown, latex = [], []
    for (model, temperature), group in rows.groupby(["model", "temperature"]):
        split = [line for line in notes if line.startswith(f"{model}, temperature {temperature:g}:")]
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
                table = sweep_table(runs, metric, order)
                note = " ".join([note, *split])
                markdown += [f"### {title}", "", table.to_markdown(), "", note, ""]
                latex += [f"% {title}", table.to_latex(escape=True), f"% {note}", ""]
            continue
        table = paper_table(group, metric, order)
        title = f"{model}, temperature {temperature:g}: {metric} / tau ({group['hardware'].iloc[0]})"
        gain = improvement(group, "graft", "eagle3", metric)
        note = f"Graft over EAGLE-3 (mean {metric}): {gain:+.1%}. " if gain is not None else ""
        checked = group[group["lossless"].notna()]
        note += f"Lossless (greedy tokens equal the baseline's): {int(checked['lossless'].sum())} of {len(checked)} method x dataset runs."
        note = " ".join([note, *split])
        markdown += [f"### {title}", "", table.to_markdown(), "", note, ""]
        latex += [f"% {title}", table.to_latex(escape=True), f"% {note}", ""]
        repeated = repeat_table(group, metric, order)
        if not repeated.empty:  # runs of run.repeats > 1: the spread between whole runs, beside the intervals
            title = f"{model}, temperature {temperature:g}: {metric} over repeats, mean (min-max) of the R passes"
            markdown += [f"### {title}", "", repeated.to_markdown(), ""]
            latex += [f"% {title}", repeated.to_latex(escape=True), ""]
    batched = batch_rows(paths, partial=partial)
    if not batched.empty and batched["batch_size"].nunique() > 1:  # experiment=batch_scaling: one column per B
        for (model, dataset, temperature, new_tokens, stream), group in batch_series(batched):
            if group["batch_size"].nunique() < 2:
                continue
            setting = f"temperature {temperature:g}, {new_tokens} new tokens" + (f", {stream} stream" if stream else "")
            title = (
                f"{model} / {dataset}: throughput over batched AR at the same batch size / tau ({setting}; "
                f"{group['hardware'].iloc[0]})"
            )
            table = batch_table(group, ordered(group["method"]))
            note = "AR's row: its throughput (new tokens per second over the whole batch, prefill included)."
            markdown += [f"### {title}", "", table.to_markdown(), "", note, ""]
            latex += [f"% {title}", table.to_latex(escape=True), f"% {note}", ""]
    stages = stage_table(rows, settings=any(is_sweep(g) for _, g in rows.groupby(["model", "temperature"])))
    if not stages.empty:
        markdown += [
            "### Share of steps per pruning stage (the stage split: check@<levels> fired, or dense)",
            "",
            stages.to_markdown(floatfmt=".1%"),
            "",
        ]
    return "\n".join(markdown), "\n".join(latex), rows


def category_tables(paths: list[str], metric: str, partial: bool = False) -> tuple[str, str, object]:
    """Per (model, temperature, dataset): rows = categories and "all", columns = methods (the baseline left
    out beside others: 1 by definition), cells "speedup [low, high] / tau [low, high]"; and the long table of
    every interval, for categories.csv."""
    import pandas as pd

    from graft.analysis.stats import MIN_N_FOR_INTERVAL
    from graft.analysis.tables import category_rows
    from graft.records.reader import RecordError

    rows = category_rows(paths, partial=partial)
    if rows.empty:
        raise RecordError(f"no run under {', '.join(map(str, paths))} has per-prompt records to resample")
    rows["method"] = [f"{m} (partial)" if p else m for m, p in zip(rows["method"], rows["partial"])]
    markdown, latex = [], []
    for (model, temperature, dataset), group in rows.groupby(["model", "temperature", "dataset"]):
        runs = group[["run", "method"]].drop_duplicates()
        if set(runs["method"]) != {"ar"}:
            runs = runs[runs["method"] != "ar"]
        twice = runs["method"].duplicated(keep=False)  # a sweep: one column per run
        labels = {
            (r.run, r.method): f"{r.method} @ {Path(r.run).name}" if repeated else r.method
            for r, repeated in zip(runs.itertuples(), twice)
        }
        rank = {m: i for i, m in enumerate(ORDER)}
        columns = sorted(labels, key=lambda key: (rank.get(key[1].split(" (")[0], len(ORDER)), key[1], key[0]))
        categories = sorted(set(group["category"]) - {"all"}) + ["all"]
        entries = {
            (r.run, r.method, r.category, r.metric): {k: None if pd.isna(v) else v for k, v in r._asdict().items()}
            for r in group.itertuples()
        }
        cells = {
            category: {labels[key]: _cell(entries, key, category, metric) for key in columns} for category in categories
        }
        table = pd.DataFrame.from_dict(cells, orient="index")[[labels[key] for key in columns]]
        table.index.name = "category"
        title = (
            f"{model} / {dataset}, temperature {temperature:g}, by category: {metric} [95% interval] / tau [95% interval] "
            f"({group['hardware'].iloc[0]})"
        )
        n = group[(group["metric"] == "tau") & (group["category"] != "all")].groupby("category")["n"].max()
        note = "Prompts per category: " + ", ".join(f"{c} {int(k)}" for c, k in n.items()) + "."
        note += f" Intervals: jackknife-t over prompts, from {MIN_N_FOR_INTERVAL} prompts on (fewer: the value and n)"
        note += "; all: stratified by category." if len(n) > 1 else "."
        markdown += [f"### {title}", "", table.to_markdown(), "", note, ""]
        latex += [f"% {title}", table.to_latex(escape=True), f"% {note}", ""]
    return "\n".join(markdown), "\n".join(latex), rows


def _cell(entries: dict, key: tuple, category: str, metric: str) -> str:
    """ "speedup [low, high] / tau [low, high]", or "speedup / tau (n=4)" below MIN_N_FOR_INTERVAL prompts."""
    from graft.analysis.stats import MIN_N_FOR_INTERVAL, format_interval

    speed, tau = entries.get((*key, category, metric)), entries.get((*key, category, "tau"))
    text = f"{format_interval(speed, 'x')} / {format_interval(tau, '')}"
    n = (tau or speed or {}).get("n")
    return f"{text} (n={int(n)})" if n and n < MIN_N_FOR_INTERVAL else text


def shown_path(path) -> str:
    """`path` relative to the repository root where it lies in it (as results/ names its runs), else to the
    working folder, else as given: so that the files written name the same runs wherever they are written from."""
    for base in (Path(__file__).resolve().parents[2], Path.cwd().resolve()):
        try:
            return str(Path(path).resolve().relative_to(base))
        except ValueError:
            continue
    return str(path)


def written_by(args: argparse.Namespace) -> str:
    """The command that writes these tables again, the output folder left as a placeholder, so that a copy
    written elsewhere has the same line."""
    import shlex

    words = ["python", "-m", "graft.report", "tables", *map(shown_path, args.paths)]
    words += ["--metric", args.metric] if args.metric != "speedup_wall" else []
    words += ["--by", args.by] if args.by else []
    words += ["--partial"] if args.partial else []
    return shlex.join(words) + " --out <this folder>"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report tables", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--metric", default="speedup_wall", choices=["speedup_wall", "speedup_decode"])
    parser.add_argument(
        "--by", choices=["category"], help="also a table per dataset with a row per category (and categories.csv)"
    )
    parser.add_argument("--out", type=Path, help="folder for tables.md, tables.tex and rows.csv")
    parser.add_argument("--partial", action="store_true", help="also unfinished runs, their rows marked (partial)")
    args = parser.parse_args(argv)
    markdown, latex, rows = build(args.paths, args.metric, args.partial)
    categories = None
    if args.by == "category":
        by_markdown, by_latex, categories = category_tables(args.paths, args.metric, args.partial)
        markdown, latex = f"{markdown}\n{by_markdown}", f"{latex}\n{by_latex}"
    print(markdown)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        command = written_by(args)  # the first line says how to write the folder again (tests/report: results/)
        (args.out / "tables.md").write_text(f"<!-- {command} -->\n{markdown}\n")
        (args.out / "tables.tex").write_text(f"% {command}\n{latex}\n")
        rows.drop(columns=["run"]).to_csv(args.out / "rows.csv", index=False)
        written = "tables.md, tables.tex, rows.csv"
        if categories is not None:
            categories.assign(run=categories["run"].map(shown_path)).to_csv(args.out / "categories.csv", index=False)
            written += ", categories.csv"
        print(f"wrote {args.out}/{written}")


if __name__ == "__main__":
    main()
