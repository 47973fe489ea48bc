"""The paper's relative claims (results/paper/relative_claims.csv: Graft over EAGLE-3, over the pruned tree,
Graft(ROOT) over EAGLE-3, Graft-DFlash over DFlash) beside the same ratios measured here with paired 95%
intervals over prompts: the table (`relative_claims`, written as beside_paper.csv) and its figure
(`beside_paper`), with the published absolute speedups where a run matches a published setting."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from graft.analysis.drawing import errorbars, legend_below, rows_context, save_figure, suptitle_layout  # noqa: E402
from graft.analysis.figure_data import run_records, run_setting, run_settings  # noqa: E402
from graft.analysis.stats import MIN_N_FOR_INTERVAL as MIN_N  # noqa: E402  (no interval below MIN_N)
from graft.analysis.stats import ratio_interval
from graft.analysis.styles import PUBLISHED, dataset_label, method_style  # noqa: E402

COMPARISONS = {
    ("graft", "eagle3"): "Graft over EAGLE-3",
    ("graft", "pruned"): "Graft over the pruned tree (no retrieval)",
    ("graft_root", "eagle3"): "Graft(ROOT) over EAGLE-3",
    ("dflash_graft", "dflash"): "Graft-DFlash over DFlash",
}
AVERAGE = {"mean", "mean_5_benchmarks", "", None}


def _number(value):
    return None if value is None or value != value or value == "" else float(value)


def _claim_for(claims, method: str, over: str, dataset: str | None):
    """The published claim about method / over that applies to `dataset`: one about that kind of dataset
    (e.g. long_context for a long-context run) before the average over the paper's benchmarks."""
    if claims is None or len(claims) == 0:
        return None
    mine = claims[(claims["method"] == method) & (claims["over"] == over)]
    specific = [
        c for c in mine.itertuples() if c.dataset not in AVERAGE and dataset and c.dataset.split("_")[0] in dataset
    ]
    average = [c for c in mine.itertuples() if c.dataset in AVERAGE or c.dataset != c.dataset]
    found = (specific or average or [None])[0]
    return found


def relative_claims(rows, claims=None):
    """The table behind beside_paper: one row per comparison run that has both methods of a published
    comparison (COMPARISONS), plus the prompts of every dataset pooled per (model, hardware, setting) when
    there are several: the ratio of the two methods' speedup_wall (mean tokens/s of one over the other on
    the same prompts) with its paired 95% interval (graft.analysis.stats.ratio_interval; the summaries'
    ratio without an interval where the records lack per-side totals), beside the published claim that
    applies (results/paper/relative_claims.csv)."""
    settings = run_settings(rows) if not rows.empty else {}
    table = []
    for (method, over), name in COMPARISONS.items():
        found = _runs_with_both(rows, method=method, over=over)
        for runs, model, dataset, hardware, setting, speeds in _entries(found, settings):
            measured = _measured_ratio(runs, speeds, method=method, over=over)
            table.append(
                {
                    "comparison": name,
                    "method": method,
                    "over": over,
                    "model": model,
                    "dataset": dataset,
                    "setting": setting,
                    "hardware": hardware,
                    "prompts": measured["n"],
                    "ratio": measured["value"],
                    "low": measured["low"],
                    "high": measured["high"],
                    **_published(_claim_for(claims, method, over, dataset)),
                }
            )
    return pd.DataFrame(table)


def _runs_with_both(rows, *, method: str, over: str) -> list[tuple]:
    """(run, its first row, {method: speedup_wall}) of every run with both methods, by model, dataset, budget."""
    found = []
    for run, group in rows.groupby("run", sort=False):
        speed = dict(zip(group["method"], group["speedup_wall"]))
        if method not in speed or over not in speed:
            continue
        first = group.iloc[0]
        found.append((run, first, speed))
    found.sort(key=lambda f: (f[1]["model"], f[1]["dataset"], run_setting(rows[rows["run"] == f[0]])[0] or 0, f[0]))
    return found


def _entries(found: list[tuple], settings: dict) -> list[tuple]:
    """(runs, model, dataset, hardware, setting, their speedups) for each run, then for each (model, hardware,
    setting) whose runs span several datasets, their prompts pooled."""
    pools: dict[tuple, list] = {}
    for run, first, speed in found:
        pools.setdefault((first["model"], first["hardware"], settings[run]), []).append((run, first, speed))
    entries = [
        ([run], first["model"], first["dataset"], first["hardware"], settings[run], [speed])
        for run, first, speed in found
    ]
    for (model, hardware, setting), members in pools.items():
        if len({m[1]["dataset"] for m in members}) > 1:
            entries.append(
                (
                    [m[0] for m in members],
                    model,
                    "all datasets (prompts pooled)",
                    hardware,
                    setting,
                    [m[2] for m in members],
                )
            )
    return entries


def _measured_ratio(runs: list, speeds: list[dict], *, method: str, over: str) -> dict:
    """{"value", "low", "high", "n"}: the paired ratio over the runs' prompts, or the summaries' mean ratio."""
    records = [r for run in runs for r in run_records(run)]
    try:
        measured = ratio_interval(records, method, over)
    except (KeyError, TypeError):
        measured = {"value": None, "low": None, "high": None, "n": 0}
    if measured["value"] is None:  # records without totals: the summaries' ratio (mean over runs)
        ratios = [s[method] / s[over] for s in speeds if s[over]]
        measured = {"value": sum(ratios) / len(ratios) if ratios else None, "low": None, "high": None, "n": 0}
    return measured


def _published(claim) -> dict:
    """The published_* columns of a claim (a row of relative_claims.csv), all None where no claim applies."""
    return {
        "published": _number(claim.value) if claim is not None else None,
        "published_low": _number(claim.low) if claim is not None else None,
        "published_high": _number(claim.high) if claim is not None else None,
        "published_about": (
            f"{claim.model if claim.model == claim.model else 'unnamed model'}, {claim.dataset}"
            if claim is not None
            else None
        ),
        "published_source": claim.source if claim is not None else None,
    }


def _claim_text(row) -> str:
    value, low, high = row["published"], row["published_low"], row["published_high"]
    if value is not None and value == value:
        text = f"{value:.3f}"
    elif low is not None and low == low and high is not None and high == high:
        text = f"{low:.3f}-{high:.3f}"
    elif high is not None and high == high:
        text = f"< {high:g}"
    elif low is not None and low == low:
        text = f"> {low:g}"
    else:
        return "no published figure in the notes"
    return f"published {text} ({row['published_about']})"


def _draw_claim(ax, y0: float, y1: float, row) -> None:
    """The published claim as a shaded band (a range, or a side of 1) or a dashed line (a point) over rows
    y0..y1 of a panel."""
    value, low, high = (row[k] for k in ("published", "published_low", "published_high"))
    value, low, high = (v if v is not None and v == v else None for v in (value, low, high))
    if value is not None:
        ax.plot([value, value], [y0, y1], ls="--", lw=1.6, color=PUBLISHED, zorder=2)
    elif low is not None or high is not None:
        left, right = ax.get_xlim()
        ax.fill_betweenx(
            [y0, y1],
            low if low is not None else min(left, (high or 1) - 0.5),
            high if high is not None else max(right, low + 0.5),
            color=PUBLISHED,
            alpha=0.3,
            lw=0,
            zorder=1,
        )


def beside_paper(rows, published, out: Path, claims=None) -> list[Path]:
    """The paper's relative claims (results/paper/relative_claims.csv: Graft over EAGLE-3, over the pruned
    tree, Graft(ROOT) over EAGLE-3, Graft-DFlash over DFlash) beside the same ratios measured in each
    comparison run, per dataset and setting, with paired 95% intervals: a check that works on any
    hardware. Below them, only where a run matches a published model, method, dataset and temperature
    (results/paper/published.csv), that published absolute speedup beside this harness's."""
    table = relative_claims(rows, claims)
    matched = _matched_published(rows, published)
    if table.empty and claims is not None and len(claims):  # nothing measured: the claims alone, listed
        table = _claims_alone(claims)
    comparisons = list(dict.fromkeys(table["comparison"])) if not table.empty else []
    fig, axes = _panels(table, comparisons=comparisons, matched=matched)
    for ax, comparison in zip(axes, comparisons):
        _draw_comparison(ax, table[table["comparison"] == comparison].reset_index(drop=True), comparison=comparison)
    if comparisons:
        axes[len(comparisons) - 1].set_xlabel(
            "Ratio of speedups (wall clock): mean tokens/s of the first method / the second's on the same prompts"
        )
    if matched:
        _draw_matched(axes[-1], matched)
    elif not comparisons:
        axes[0].axis("off")
        axes[0].text(0.5, 0.5, "no published claim to set beside these runs", ha="center", va="center")
    handles = _key()
    suptitle_layout(fig, f"The paper's relative claims beside the same ratios measured here\n{rows_context(rows)}")
    legend_below(fig, handles, [h.get_label() for h in handles], ncol=3)
    written = save_figure(fig, out, "beside_paper")
    table.to_csv(Path(out) / "beside_paper.csv", index=False)
    return written


def _matched_published(rows, published) -> list[tuple]:
    """(label, published speedup, this harness's mean speedup_wall, method) for each published absolute speedup
    whose model, method, dataset and temperature some run here matches."""
    matched = []
    for pub in published.itertuples():
        if pub.speedup != pub.speedup:  # NaN: a relative claim with no absolute figure
            continue
        mine = rows[(rows["model"] == pub.model) & (rows["method"] == pub.method) & (rows["dataset"] == pub.dataset)]
        mine = mine[mine["temperature"] == pub.temperature]
        if not mine.empty:
            label = f"{pub.paper}: {pub.model} {method_style(pub.method)['label']} {dataset_label(pub.dataset)}"
            matched.append((label, float(pub.speedup), float(mine["speedup_wall"].mean()), pub.method))
    return matched


def _claims_alone(claims) -> pd.DataFrame:
    """relative_claims' columns for every published claim, with nothing measured beside it."""
    return pd.DataFrame(
        [
            {
                "comparison": COMPARISONS.get((c.method, c.over), f"{c.method} over {c.over}"),
                "method": c.method,
                "over": c.over,
                "dataset": f"published: {c.model if c.model == c.model else 'unnamed model'}, {c.dataset}",
                "setting": "no run here has both methods",
                "ratio": None,
                "low": None,
                "high": None,
                "prompts": 0,
                **_published(c),
            }
            for c in claims.itertuples()
        ]
    )


def _panels(table, *, comparisons: list[str], matched: list[tuple]) -> tuple:
    """The figure and its panels, one column: one per comparison, its height by its rows, then the matched
    published speedups."""
    heights = [max(1.4, 0.32 * (table["comparison"] == c).sum() + 0.9) for c in comparisons]
    if matched:
        heights.append(max(1.6, 0.42 * len(matched) + 0.9))
    if not heights:
        heights = [1.6]
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(9.0, sum(heights) + 1.2), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    return fig, axes[:, 0]


def _draw_comparison(ax, part, *, comparison: str) -> None:
    """One comparison's panel: a row per dataset and setting, the ratio measured here with its interval
    beside the published claim that applies."""
    style = method_style(part["method"].iloc[0])
    ys = list(range(len(part)))[::-1]
    values = [(r.ratio, r.low, r.high) for r in part.itertuples()]
    have = [(y, v) for y, v in zip(ys, values) if v[0] is not None]
    if have:
        ax.errorbar(
            [v[0] for _, v in have],
            [y for y, _ in have],
            xerr=errorbars([v for _, v in have]),
            fmt=style["marker"],
            color=style["color"],
            ms=6,
            capsize=2.5,
            lw=1.2,
            zorder=3,
            label=f"measured here (95% interval over prompts, from {MIN_N})",
        )
    ax.axvline(1.0, color="0.3", lw=0.8, ls=":")
    xs = [v for val in values for v in val if v is not None]
    xs += [v for k in ("published", "published_low", "published_high") for v in part[k] if v is not None and v == v]
    lo, hi = min(xs + [1.0]), max(xs + [1.0])
    pad = max(0.05, 0.08 * (hi - lo))
    ax.set_xlim(lo - pad, hi + pad)
    for y, row in zip(ys, part.to_dict("records")):
        _draw_claim(ax, y - 0.45, y + 0.45, row)
    ax.set_ylim(-0.6, len(part) - 0.4)
    labels = [
        f"{dataset_label(r.dataset)}, {r.setting}" + (f" (n={r.prompts})" if r.prompts else "")
        for r in part.itertuples()
    ]
    ax.set_yticks(ys, labels, fontsize=7)
    claims_text = "; ".join(dict.fromkeys(_claim_text(r) for r in part.to_dict("records")))
    ax.set_title(f"{comparison}: {claims_text}", fontsize=8, loc="left")
    ax.grid(axis="x", alpha=0.25)


def _draw_matched(ax, matched: list[tuple]) -> None:
    """The published absolute speedups (grey) beside this harness's (in the method's colour)."""
    ys = range(len(matched))
    ax.barh([y + 0.2 for y in ys], [m[1] for m in matched], height=0.4, color=PUBLISHED, alpha=0.5, label="published")
    colours = [method_style(m[3])["color"] for m in matched]
    ax.barh([y - 0.2 for y in ys], [m[2] for m in matched], height=0.4, color=colours)
    ax.set_yticks(list(ys), [m[0] for m in matched], fontsize=7)
    mine = Patch(facecolor="white", edgecolor="0.3", label="this harness (in the method's colour)")
    ax.legend(handles=[*ax.get_legend_handles_labels()[0], mine], fontsize=7, loc="lower right")
    ax.set_xlabel("Speedup over autoregressive (wall clock, x), where a run matches a published setting")


def _key() -> list:
    """The legend under the figure: what a measured point, a published line and a published band are."""
    return [
        Line2D(
            [], [], marker="o", color="0.3", ls="none", label=f"measured here, 95% interval over prompts (from {MIN_N})"
        ),
        Line2D([], [], ls="--", color=PUBLISHED, label="published ratio"),
        Patch(color=PUBLISHED, alpha=0.3, label="published range (or side of 1)"),
    ]
