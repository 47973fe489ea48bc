"""Figures from run or sweep directories: Pareto frontiers (speedup and tau against verified nodes per
step), per-dataset speedup bars, accepted-length histograms, retrieval's share of accepted tokens by
pruning stage, where a step's time goes, and the published speedups beside this harness's where the
setting matches (results/paper/published.csv). PNG and PDF.

    python -m graft.report plot multirun/pareto [more dirs ...] --out results/figures
"""

from __future__ import annotations

import argparse
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[2] / "results" / "paper" / "published.csv"


def make_figures(paths: list[str], out: Path) -> list[Path]:
    import pandas as pd

    from graft import plots
    from graft.analysis import RecordError, method_rows, step_rows

    rows, steps = method_rows(paths), step_rows(paths)
    if rows.empty:
        raise RecordError(f"no run under {', '.join(map(str, paths))} has finished a prompt")
    written = plots.pareto_figures(rows, out) + plots.speedup_bars(rows, out)
    written += plots.accept_histograms(steps, out) + plots.retrieval_by_stage(steps, out) + plots.time_split(steps, out)
    published = pd.read_csv(PUBLISHED)
    published["model"] = published["model"].fillna("")
    written += plots.beside_paper(rows, published, out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.report plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", type=Path, default=Path("figures"))
    args = parser.parse_args(argv)
    for path in make_figures(args.paths, args.out):
        print(path)


if __name__ == "__main__":
    main()
