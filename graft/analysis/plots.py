"""Figures from runs (matplotlib, no display needed): a comparison's Pareto figure, and for run or sweep
folders the Pareto curves (speedup and tau against verified nodes per step, one line per method through its
settings, the overall frontier dashed), speedup bars per setting and per prompt category with 95% intervals
over prompts (graft.analysis.stats; none below its MIN_N_FOR_INTERVAL prompts), accepted-length histograms,
retrieval's share by pruning stage, the time split and batch scaling. The paper's claims beside the ratios
measured here are graft/analysis/claims.py's; colours and labels graft/analysis/styles.py's."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from graft.analysis.drawing import (  # noqa: E402
    bar_groups,
    draw_frontier,
    errorbars,
    legend_below,
    legend_handles,
    nodes_axis,
    panel_title,
    rows_context,
    save_figure,
    suptitle_layout,
    wrap,
)
from graft.analysis.figure_data import interval_cell, run_intervals, run_settings  # noqa: E402
from graft.analysis.stats import MIN_N_FOR_INTERVAL as MIN_N  # noqa: E402  (no interval below MIN_N)
from graft.analysis.styles import (  # noqa: E402
    AXES,
    STAGE_COLOURS,
    TIME_COLOURS,
    dataset_label,
    hardware_name,
    method_order,
    method_style,
)

# every figure `python -m graft.report plot` writes (PNG and PDF each); tests/report/test_notebook.py reads it
FIGURES = (
    "pareto_speedup_wall",
    "pareto_speedup_decode",
    "pareto_tau",
    "bars_speedup_wall",
    "category_speedup_wall",
    "accept_histograms",
    "retrieval_by_stage",
    "time_split",
    "beside_paper",
)


def plot_comparison_pareto(summary: dict, path: str | Path, metric: str = "speedup_decode") -> Path:
    """One point per method of a comparison: `metric` against verified nodes per step; the frontier drawn."""
    rows = {name: row for name, row in summary["rows"].items() if row.get(metric) is not None}
    points = {n: (rows[n]["avg_nodes_per_step"], rows[n][metric]) for n in method_order(rows)}
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    for name, (x, y) in points.items():
        style = method_style(name)
        ax.scatter([x], [y], s=40, color=style["color"], marker=style["marker"], label=style["label"], zorder=3)
    draw_frontier(ax, list(points.values()))
    if metric.startswith("speedup"):
        ax.axhline(1.0, color="grey", lw=0.8)
    nodes_axis(ax, [p[0] for p in points.values()])
    ax.set_ylabel(AXES.get(metric, metric))
    ax.set_title(
        f"{summary['model']} / {dataset_label(summary['dataset'])} on {hardware_name(summary['hardware'])}", fontsize=10
    )
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    ax.grid(alpha=0.25)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def pareto_figures(rows, out: Path) -> list[Path]:
    """Speedup (wall clock and decode only) and tau against verified nodes per step: one line per method
    through its settings (budget, thresholds; each averaged over datasets), sorted by nodes per step, the
    autoregressive baseline at (1, 1), and the overall frontier (dashed grey steps through the points no
    other beats). A point from one run has its 95% interval over prompts (from MIN_N_FOR_INTERVAL prompts)."""
    written = []
    rows = rows.copy()
    rows["thresholds"] = rows["thresholds"].fillna("-")
    metrics = ["speedup_wall", "speedup_decode", "tau"]
    grouped = rows.groupby(["method", "budget", "thresholds"], dropna=False)
    points = grouped[["avg_nodes_per_step", *metrics]].mean()
    points["runs"] = grouped["run"].agg(list)
    points = points.reset_index()
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(7.2, 4.8))
        everything = []
        for method in method_order(points["method"]):
            group = points[points["method"] == method].dropna(subset=["avg_nodes_per_step", metric])
            group = group.sort_values("avg_nodes_per_step")
            if group.empty:
                continue
            style = method_style(method)
            xs, ys = list(group["avg_nodes_per_step"]), list(group[metric])
            everything += list(zip(xs, ys))
            ax.plot(xs, ys, "-", lw=1.3, ms=6 if method != "ar" else 10, zorder=3, **style)
            cells = [
                interval_cell(runs[0], method, metric, y) if len(runs) == 1 and method != "ar" else (y, None, None)
                for runs, y in zip(group["runs"], ys)
            ]
            if any(c[1] is not None for c in cells):
                ax.errorbar(xs, ys, yerr=errorbars(cells), fmt="none", ecolor=style["color"], lw=0.8, alpha=0.6)
            if len(group) > 1:
                for x, y, budget in zip(xs, ys, group["budget"]):
                    ax.annotate(
                        f"{budget:g}",
                        (x, y),
                        textcoords="offset points",
                        xytext=(4, 3),
                        fontsize=6,
                        color=style["color"],
                    )
        draw_frontier(ax, everything)
        if metric.startswith("speedup"):
            ax.axhline(1.0, color="0.3", lw=0.8, ls=":")
        nodes_axis(ax, [p[0] for p in everything])
        ax.set_ylabel(AXES[metric])
        ax.grid(alpha=0.25)
        panel_title(ax, f"{AXES[metric].split(' (')[0]} against verified nodes per step (labels: budget K)", rows, True)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
        fig.tight_layout()
        written += save_figure(fig, out, f"pareto_{metric}")
    return written


def speedup_bars(rows, out: Path, metric: str = "speedup_wall") -> list[Path]:
    """`metric` of every method, never averaged over settings: one group of bars per dataset when each
    dataset has one run, else one panel per dataset with a group per run's setting (budget K, thresholds);
    95% intervals over prompts where the records give them (graft.analysis.stats: from 10 prompts)."""
    data = rows[rows["method"] != "ar"]
    methods = method_order(data["method"])
    settings = run_settings(rows)
    panels = list(dict.fromkeys(zip(data["model"], data["dataset"])))
    several_models = len({m for m, _ in panels}) > 1

    def cells(group):
        return {r.method: interval_cell(r.run, r.method, metric, getattr(r, metric)) for r in group.itertuples()}

    def name(model, dataset):
        return f"{model} / {dataset_label(dataset)}" if several_models else dataset_label(dataset)

    sweep = data.groupby(["model", "dataset"])["run"].nunique().max() > 1
    if not sweep:
        groups = [(name(m, d), cells(data[(data["model"] == m) & (data["dataset"] == d)])) for m, d in panels]
        fig, axes = plt.subplots(figsize=(max(7.0, 0.18 * len(methods) * len(groups) + 2), 4.6), squeeze=False)
        bar_groups(axes[0][0], groups, methods, metric)
        plt.setp(axes[0][0].get_xticklabels(), rotation=20, ha="right")
    else:
        n_groups = max(data[(data["model"] == m) & (data["dataset"] == d)]["run"].nunique() for m, d in panels)
        fig, axes = plt.subplots(
            len(panels), 1, figsize=(max(7.0, 0.2 * len(methods) * n_groups + 2), 3.4 * len(panels)), squeeze=False
        )
        for ax, (m, d) in zip(axes[:, 0], panels):
            panel = data[(data["model"] == m) & (data["dataset"] == d)]
            runs = sorted(panel["run"].unique(), key=lambda r: list(settings).index(r))
            bar_groups(ax, [(settings[r], cells(panel[panel["run"] == r])) for r in runs], methods, metric)
            ax.set_title(name(m, d), fontsize=9)
            ax.set_xlabel("setting (budget K = verified nodes allowed per step; thresholds)", fontsize=8)
    panel_title(axes[0][0], f"{AXES[metric]}, 95% intervals over prompts (from {MIN_N} prompts)", rows)
    fig.tight_layout()
    legend_below(fig, *legend_handles(axes))
    return save_figure(fig, out, f"bars_{metric}")


def category_bars(rows, out: Path, metric: str = "speedup_wall") -> list[Path]:
    """Per run (model, dataset, setting) whose prompts span several categories: `metric` per category and
    method, "all prompts" first, with 95% intervals over the category's prompts (none below 10)
    (graft.analysis.stats.intervals on the run's records). Runs of one category are named in a note (their bars are
    bars_<metric>); when no run has several, every run's overall figure is drawn instead."""
    data = rows[rows["method"] != "ar"]
    if data.empty:  # the baseline alone: nothing to compare per category
        return []
    methods = method_order(data["method"])
    settings = run_settings(rows)
    runs = list(dict.fromkeys(data.sort_values(["model", "dataset"], kind="stable")["run"]))
    panels, single = [], []
    for run in runs:
        group = data[data["run"] == run]
        stats = run_intervals(run)
        categories = sorted({c for m in group["method"] for c in (stats.get(m) or {}).get("categories", {})})
        n = {
            c: next((e["categories"][c][metric]["n"] for e in stats.values() if c in e["categories"]), 0)
            for c in categories
        }
        overall = {r.method: interval_cell(run, r.method, metric, getattr(r, metric)) for r in group.itertuples()}
        groups = [(f"all prompts\n(n={int(group['n_prompts'].max())})", overall)]
        groups += [
            (f"{c}\n(n={n[c]})", {m: interval_cell(run, m, metric, None, c) for m in group["method"]})
            for c in categories
        ]
        first = group.iloc[0]
        name = f"{first['model']} / {dataset_label(first['dataset'])}, {settings[run]}"
        (panels if len(categories) > 1 else single).append((name, groups[:1] if len(categories) <= 1 else groups))
    if not panels:
        panels, single = single, []
    width = max(7.0, 0.16 * len(methods) * max(len(g) for _, g in panels) + 2)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.0 * len(panels) + 0.8), squeeze=False)
    for ax, (name, groups) in zip(axes[:, 0], panels):
        bar_groups(ax, groups, methods, metric)
        ax.set_title(name, fontsize=9)
    title = (
        f"{AXES[metric]} per prompt category, 95% intervals over prompts (from {MIN_N} prompts)\n{rows_context(rows)}"
    )
    if single:
        title += "\nruns of one category (see bars_" + metric + "): " + "; ".join(name for name, _ in single)
    suptitle_layout(fig, title, 130)
    legend_below(fig, *legend_handles(axes))
    return save_figure(fig, out, f"category_{metric}")


def accept_histograms(steps, out: Path) -> list[Path]:
    """Tokens committed per step (accepted + bonus), one panel per method in its colour, as shares of its
    steps (all runs pooled), tau in the panel's title."""
    methods = [m for m in method_order(steps["method"].unique()) if m != "ar"] if not steps.empty else []
    cols = min(4, max(1, len(methods)))
    nrows = max(1, math.ceil(len(methods) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(2.9 * cols, 2.5 * nrows), sharey=True, squeeze=False)
    top = int(steps["accepted"].max()) if methods else 1
    for ax, method in zip(axes.flat, methods):
        values = steps.loc[steps["method"] == method, "accepted"]
        style = method_style(method)
        ax.hist(values, bins=range(1, top + 2), align="left", rwidth=0.85, color=style["color"], density=True)
        ax.set_title(f"{style['label']} (tau {values.mean():.2f})", fontsize=8)
        ax.set_xlabel("Tokens committed per step", fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(methods) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("Share of steps", fontsize=7)
    if not methods:
        axes[0][0].text(0.5, 0.5, "no speculative steps recorded", ha="center", va="center")
    context = rows_context(steps if "hardware" in steps else steps.assign(hardware=None)) if not steps.empty else ""
    suptitle_layout(fig, f"Tokens committed per step (accepted + bonus), all runs pooled\n{context}")
    return save_figure(fig, out, "accept_histograms")


def _stage_key(stage: str) -> tuple:
    """dense first, then check@<depth> by depth."""
    digits = "".join(ch if ch.isdigit() else " " for ch in stage).split()
    return (stage != "dense", [int(d) for d in digits], stage)


def retrieval_by_stage(steps, out: Path) -> list[Path]:
    """Share of accepted tokens that retrieval proposed, per pruning stage, for the methods that record stages
    and retrieve (all runs pooled)."""
    share = None
    if not steps.empty:
        staged = steps.dropna(subset=["stage"])
        staged = staged[staged["method"] != "ar"]
        sums = staged.groupby(["method", "stage"])[["accepted_draft", "accepted_retrieved"]].sum()
        retrieving = sums.groupby(level="method")["accepted_retrieved"].sum()
        sums = sums[sums.index.get_level_values("method").isin(retrieving[retrieving > 0].index)]
        if not sums.empty:
            share = (sums["accepted_retrieved"] / (sums["accepted_draft"] + sums["accepted_retrieved"])).unstack()
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    if share is not None:
        share = share.loc[method_order(share.index), sorted(share.columns, key=_stage_key)]
        share.index = [method_style(m)["label"] for m in share.index]
        colours = [STAGE_COLOURS[k % len(STAGE_COLOURS)] for k in range(len(share.columns))]
        share.plot.bar(ax=ax, color=colours, rot=0)
        ax.legend(title="stage (confidence checkpoint)", fontsize=7, title_fontsize=7)
    else:
        text = "no method here records pruning stages and retrieves"
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("Accepted tokens proposed by retrieval (share)")
    ax.set_xlabel("")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.25)
    context = rows_context(steps if "hardware" in steps else steps.assign(hardware=None)) if not steps.empty else ""
    ax.set_title(
        wrap(f"Retrieval's share of accepted tokens by pruning stage\n{context}", 100),
        fontsize=9,
    )
    fig.tight_layout()
    return save_figure(fig, out, "retrieval_by_stage")


def time_split(steps, out: Path) -> list[Path]:
    """Where a step's time goes, per method: draft, verify and the rest (ms per step, stacked, runs pooled)."""
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    if not steps.empty:
        ms = steps.groupby("method")[list(TIME_COLOURS)].mean()
        ms = ms.loc[method_order(ms.index)]
        ms.index = [method_style(m)["label"] for m in ms.index]
        ms.columns = ["draft", "verify", "other (sampling, tree, bookkeeping)"]
        ms.plot.bar(stacked=True, ax=ax, color=list(TIME_COLOURS.values()), rot=30)
        plt.setp(ax.get_xticklabels(), ha="right", fontsize=8)
        ax.legend(fontsize=7)
    ax.set_ylabel("Milliseconds per verification step")
    ax.set_xlabel("")
    ax.grid(axis="y", alpha=0.25)
    context = rows_context(steps if "hardware" in steps else steps.assign(hardware=None)) if not steps.empty else ""
    ax.set_title(
        wrap(f"Time per verification step, all runs pooled\n{context}", 100),
        fontsize=9,
    )
    fig.tight_layout()
    return save_figure(fig, out, "time_split")


def batch_scaling(rows, out: Path) -> list[Path]:
    """Per (model, dataset) with runs at more than one batch size (graft/analysis/batch.py: batch_rows): left,
    each method's throughput over batched AR's at the same batch size against the batch size, with the
    per-sequence speedup_wall's 95% interval over prompts as a bar where the run has one; right, throughput
    (new tokens per second over the whole batch) against the batch size, AR's included."""
    written = []
    if rows.empty or rows["batch_size"].nunique() < 2:
        return written
    from graft.analysis.batch import batch_series, is_ar

    for (model, dataset, temperature, new_tokens, stream), group in batch_series(rows):
        if group["batch_size"].nunique() < 2:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for method in method_order(group["method"]):
            runs = group[group["method"] == method].sort_values("batch_size")
            style = method_style(method)
            right.plot(
                runs["batch_size"],
                runs["throughput_tokens_per_s"],
                marker=style["marker"],
                color=style["color"],
                label=style["label"],
            )
            if is_ar(method):
                continue
            left.plot(
                runs["batch_size"],
                runs["speedup_throughput"],
                marker=style["marker"],
                color=style["color"],
                label=style["label"],
            )
            if "speedup_wall_low" in runs:
                shown = runs[runs["speedup_wall_low"].notna()]
                left.vlines(
                    shown["batch_size"],
                    shown["speedup_wall_low"],
                    shown["speedup_wall_high"],
                    color=style["color"],
                    alpha=0.35,
                    lw=4,
                )
        left.axhline(1.0, color="grey", lw=0.8, ls="--")
        for ax, label in ((left, "throughput over batched AR (x)"), (right, "tokens/s over the batch")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            ax.set_xlabel("batch size (run.batch_size)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        left.set_title("speedup over batched AR (bars: per-sequence speedup_wall, 95% interval)", fontsize=9)
        right.set_title("throughput, prefill included", fontsize=9)
        handles, labels = right.get_legend_handles_labels()
        legend_below(fig, handles, labels)
        setting = f"{new_tokens} new tokens" + (f", temperature {temperature:g}" if temperature else "")
        setting += f", {stream} stream" if stream else ""
        title = f"{model} / {dataset_label(dataset)} on {group['hardware'].iloc[0]}: batch scaling ({setting})"
        suptitle_layout(fig, title)
        # one file per series: the settings that split series name it
        suffix = (
            f"_{new_tokens}tok"
            + (f"_t{temperature:g}" if temperature else "")
            + ("_groups" if stream == "groups of 2B" else "")
        )
        written += save_figure(fig, out, f"batch_scaling_{model}_{dataset}{suffix}")
    return written
