"""Figures from run or sweep directories: Pareto curves (speedup, wall clock and decode only, and tau against
verified nodes per step, one line per method through its settings, the overall frontier dashed), speedup
bars per dataset and setting and per prompt category with 95% bootstrap intervals over prompts,
accepted-length histograms, retrieval's share of accepted tokens by pruning stage, where a step's time goes,
and the paper's relative claims (results/paper/relative_claims.csv) beside the same ratios measured here,
with the published absolute speedups where a run matches the setting (results/paper/published.csv).
PNG and PDF; the table behind the last figure as beside_paper.csv.

    python -m graft.report plot multirun/pareto [more dirs ...] --out results/figures

Finished runs only; `--partial` draws unfinished ones too (each named on stderr).
"""

from __future__ import annotations

import argparse
from pathlib import Path

PAPER = Path(__file__).resolve().parent / "paper"  # package data (results/paper/ links here), so plot runs anywhere
PUBLISHED = PAPER / "published.csv"
CLAIMS = PAPER / "relative_claims.csv"


def make_figures(paths: list[str], out: Path, partial: bool = False) -> list[Path]:
    import pandas as pd

    from graft.analysis import claims as paper_claims
    from graft.analysis import plots
    from graft.analysis.batch import batch_rows
    from graft.analysis.tables import method_rows, step_rows
    from graft.records.reader import RecordError

    rows, steps = method_rows(paths, partial=partial), step_rows(paths, partial=partial)
    if rows.empty:
        raise RecordError(f"no run under {', '.join(map(str, paths))} has finished a prompt")
    if not steps.empty:
        steps["hardware"] = steps["run"].map(dict(zip(rows["run"], rows["hardware"])))
    written = plots.pareto_figures(rows, out) + plots.speedup_bars(rows, out) + plots.category_bars(rows, out)
    written += plots.accept_histograms(steps, out) + plots.retrieval_by_stage(steps, out) + plots.time_split(steps, out)
    published = pd.read_csv(PUBLISHED)
    published["model"] = published["model"].fillna("")
    claims = pd.read_csv(CLAIMS, dtype={"dataset": str, "model": str}) if CLAIMS.is_file() else None
    written += paper_claims.beside_paper(rows, published, out, claims)
    written += plots.batch_scaling(batch_rows(paths, partial=partial), out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", type=Path, default=Path("figures"))
    parser.add_argument("--partial", action="store_true", help="also unfinished runs")
    args = parser.parse_args(argv)
    for path in make_figures(args.paths, args.out, args.partial):
        print(path)


if __name__ == "__main__":
    main()
