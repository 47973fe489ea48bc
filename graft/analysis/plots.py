"""Figures from runs (matplotlib, no display needed): a comparison's Pareto figure, and for run or sweep
folders the Pareto curves (speedup and tau against verified nodes per step, one line per method through its
settings, the overall frontier dashed), speedup bars per setting and per prompt category with 95% intervals
over prompts (graft.analysis.stats; none below its MIN_N_FOR_INTERVAL prompts), accepted-length histograms, retrieval's
share by pruning stage, the time split, and the paper's relative claims beside the same ratios measured here.

Every method keeps one colour and marker in every figure (`method_style`, keyed by its name: Graft variants
in reds and oranges, EAGLE-3 variants in blues, DFlash in greens, retrieval baselines in purples, from the
colour-blind-safe sets of Okabe-Ito and Paul Tol); a name not listed gets a colour from a hash of the name,
never from its position. Titles name the model, dataset and hardware; axes their units."""

from __future__ import annotations

import hashlib
import math
import textwrap
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

from graft.analysis.stats import MIN_N_FOR_INTERVAL as MIN_N, shown as stats_shown  # noqa: E402  (no interval below MIN_N)

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

# name: (colour, marker, label). Order = legend order.
PALETTE = {
    "ar": ("#000000", "*", "Autoregressive"),
    # retrieval only (purples), SAM-Decoding's switch (olive)
    "pld": ("#CC79A7", "P", "PLD"),
    "suffix": ("#AA4499", "X", "Suffix (SuffixDecoding)"),
    "recycling": ("#882255", "h", "Token Recycling"),
    "samd": ("#999933", "d", "SAM-Decoding (on EAGLE-3)"),
    # EAGLE-3 and its trees (blues)
    "eagle3": ("#0072B2", "o", "EAGLE-3"),
    "eagle3_chain": ("#56B4E9", "s", "EAGLE-3 chain"),
    "eagle3_static": ("#332288", "^", "EAGLE-3 static tree"),
    "eagle3_auto": ("#88CCEE", "D", "EAGLE-3, auto budget"),
    "pruned": ("#44AA99", "v", "Pruned EAGLE-3 tree"),
    # Graft and its variants (reds, oranges)
    "graft": ("#D55E00", "o", "Graft"),
    "graft_root": ("#E69F00", "s", "Graft(ROOT)"),
    "graft_noprune": ("#994F00", "^", "Graft w/o prune"),
    "graft_tail": ("#EE3377", "D", "Graft(TAIL)"),
    "graft_refill": ("#A50F15", "P", "Graft + refill"),
    "graft_auto": ("#F4A582", "X", "Graft, auto budget"),
    "dflash_graft": ("#FC8D59", "h", "Graft-DFlash"),
    # DFlash (greens)
    "dflash": ("#117733", "o", "DFlash"),
    "dflash_tree": ("#66BB55", "s", "DFlash tree"),
}
FALLBACK_COLOURS = ("#7F7F7F", "#BCBD22", "#17BECF", "#8C564B", "#9467BD", "#2CA02C", "#1F77B4", "#FF7F0E")
FALLBACK_MARKERS = "os^Dv<>Ph*X"

AXES = {
    "speedup_wall": "Speedup over autoregressive (wall clock, x)",
    "speedup_decode": "Speedup over autoregressive (decode only, x)",
    "tau": "Accepted tokens per step (tau)",
    "avg_nodes_per_step": "Verified nodes per step (root included)",
}
DATASETS = {
    "eagle_mt_bench": "MT-Bench",
    "eagle_humaneval": "HumanEval",
    "eagle_gsm8k": "GSM8K",
    "eagle_alpaca": "Alpaca",
    "eagle_cnndm": "CNN/DM",
    "eagle_natural_questions": "Natural Questions",
    "gsm8k": "GSM8K",
    "spec_bench": "Spec-Bench",
    "builtin": "built-in prompts",
    "builtin_quick": "built-in prompts (quick)",
    "long_synthetic": "long context (synthetic)",
}
STAGE_COLOURS = ("#BBBBBB", "#004488", "#DDAA33", "#BB5566", "#000000")
PUBLISHED = "#555555"  # the paper's figures, in no method's colour
TIME_COLOURS = {"draft_ms": "#DDAA33", "verify_ms": "#004488", "other_ms": "#BBBBBB"}


def method_style(name: str) -> dict:
    """{"color", "marker", "label"} of a method, the same in every figure whatever else is plotted; a name not
    in PALETTE gets a colour and marker from a hash of the name (stable across processes)."""
    if name in PALETTE:
        colour, marker, label = PALETTE[name]
    else:
        digest = int(hashlib.sha256(name.encode()).hexdigest(), 16)
        colour = FALLBACK_COLOURS[digest % len(FALLBACK_COLOURS)]
        marker = FALLBACK_MARKERS[(digest // len(FALLBACK_COLOURS)) % len(FALLBACK_MARKERS)]
        label = name
    return {"color": colour, "marker": marker, "label": label}


def method_order(names) -> list[str]:
    """Methods in legend order: PALETTE's order, then unknown names alphabetically."""
    rank = {name: k for k, name in enumerate(PALETTE)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def dataset_label(name: str) -> str:
    return DATASETS.get(name, name)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: fewer or equal nodes and a higher value, or equal value
    with fewer nodes (x = cost, lower is better; y = value, higher is better), sorted by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def hardware_name(hardware: dict) -> str:
    return hardware.get("gpu") or hardware.get("cpu") or hardware.get("device", "?")


def _nodes_axis(ax, xs) -> None:
    """Verified nodes per step on a log2 axis with plain numbers when it spans more than a factor of 4."""
    xs = [x for x in xs if x and x > 0]
    if xs and max(xs) / min(xs) > 4:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(AXES["avg_nodes_per_step"])


def _frontier(ax, points: list[tuple[float, float]]) -> None:
    """The overall Pareto frontier as dashed grey steps, held flat to the costliest point."""
    front = [points[i] for i in pareto_front(points)]
    if front:
        xs, ys = [p[0] for p in front], [p[1] for p in front]
        right = max(p[0] for p in points)
        if right > xs[-1]:
            xs, ys = xs + [right], ys + [ys[-1]]
        ax.step(xs, ys, where="post", ls="--", lw=1.2, color="0.45", zorder=1, label="Pareto frontier (all methods)")


def _wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def plot_comparison_pareto(summary: dict, path: str | Path, metric: str = "speedup_decode") -> Path:
    """One point per method of a comparison: `metric` against verified nodes per step; the frontier drawn."""
    rows = {name: row for name, row in summary["rows"].items() if row.get(metric) is not None}
    points = {n: (rows[n]["avg_nodes_per_step"], rows[n][metric]) for n in method_order(rows)}
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    for name, (x, y) in points.items():
        style = method_style(name)
        ax.scatter([x], [y], s=40, color=style["color"], marker=style["marker"], label=style["label"], zorder=3)
    _frontier(ax, list(points.values()))
    if metric.startswith("speedup"):
        ax.axhline(1.0, color="grey", lw=0.8)
    _nodes_axis(ax, [p[0] for p in points.values()])
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


def _save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


def _context(rows, mean: bool = False) -> str:
    """The model, the datasets ("mean over N datasets (...)" when `mean`) and the hardware of some rows."""
    models = ", ".join(sorted(set(rows["model"])))
    datasets = sorted(set(rows["dataset"]))
    hardware = "; ".join(sorted({str(h) for h in rows["hardware"] if h is not None and h == h})) or "unknown hardware"
    data = ", ".join(dataset_label(d) for d in datasets)
    if mean and len(datasets) > 1:
        data = f"mean over {len(datasets)} datasets ({data})"
    return f"{models} / {data} on {hardware}"


def _suptitle_layout(fig, text: str, width: int = 110) -> None:
    """A figure title over several panels, and the panels laid out below it."""
    text = _wrap(text, width)
    fig.suptitle(text, fontsize=9)
    lines = text.count("\n") + 1
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.17 * lines + 0.08) / fig.get_figheight()))


def _title(ax, what: str, rows, mean: bool = False) -> None:
    ax.set_title(_wrap(f"{what}\n{_context(rows, mean)}"), fontsize=9)


def _legend_below(fig, handles, labels, ncol: int = 5) -> None:
    if handles:
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8, frameon=False)


# ---- records: 95% intervals over prompts (graft.analysis.stats), cached per run ----------------------------------


@lru_cache(maxsize=256)
def _records(run: str, stamp: int) -> tuple:
    from graft.records.reader import RecordError, read_records, read_summary

    try:
        method = read_summary(Path(run)).get("method")
        records = read_records(Path(run))
    except RecordError:
        return ()
    for record in records:
        record["_method"] = method
        record["_run"] = run  # records of several runs pooled: stratified by run, repeats told apart by run
    return tuple(records)


def run_records(run) -> list[dict]:
    """The prompt records of a run directory ([] when it has none readable)."""
    summary = Path(run) / "summary.json"
    stamp = summary.stat().st_mtime_ns if summary.exists() else 0
    return list(_records(str(run), stamp))


@lru_cache(maxsize=256)
def _intervals(run: str, stamp: int) -> dict:
    from graft.records.reader import RecordError
    from graft.analysis.tables import run_intervals as intervals_of

    try:
        return intervals_of(Path(run))
    except RecordError:
        return {}


def run_intervals(run) -> dict:
    """The run's intervals as the tables give them (graft.analysis.tables.run_intervals), {} when its records lack
    what they read."""
    summary = Path(run) / "summary.json"
    return _intervals(str(run), summary.stat().st_mtime_ns if summary.exists() else 0)


def _interval(run, method: str, metric: str, value, category: str | None = None) -> tuple:
    """(value, low, high) of `metric` of `method` in `run`: the summary's value, with the 95% interval (from
    MIN_N_FOR_INTERVAL prompts on) where the records give one whose point value is that same figure (else
    low = high = None)."""
    entry = run_intervals(run).get(method) or {}
    entry = entry.get("all") if category is None else (entry.get("categories") or {}).get(category)
    found = (entry or {}).get(metric) or {}
    if category is not None:
        value = found.get("value")
    if value is None or value != value:
        return None, None, None
    point = found.get("value")
    if point is None or not stats_shown(found) or abs(point - value) > 1e-6 * max(1.0, abs(value)):
        return float(value), None, None
    return float(value), found["low"], found["high"]


def _errorbars(values: list[tuple]) -> list[list[float]]:
    low = [v - lo if lo is not None else 0.0 for v, lo, _ in values]
    high = [hi - v if hi is not None else 0.0 for v, _, hi in values]
    return [low, high]


def _setting(group) -> tuple:
    """A run's setting: the budget (total_tokens) and thresholds most of its methods ran with."""
    methods = group[group["method"] != "ar"]
    budgets = methods["budget"].dropna()
    thresholds = methods["thresholds"].dropna()
    budget = int(budgets.mode().iloc[0]) if not budgets.empty else None
    return budget, (thresholds.mode().iloc[0] if not thresholds.empty else None)


def run_settings(rows) -> dict[str, str]:
    """{run: label of its setting} ("K=16", with the thresholds where they vary among runs of one dataset)."""
    labels = {}
    for _, runs in rows.groupby(["model", "dataset"], sort=False):
        settings = {run: _setting(group) for run, group in runs.groupby("run", sort=False)}
        vary = len({s[1] for s in settings.values()}) > 1
        seen: dict[str, int] = {}
        for run, (budget, thresholds) in sorted(settings.items(), key=lambda kv: (kv[1][0] or 0, str(kv[1][1]))):
            label = f"K={budget}" if budget is not None else "-"
            if vary:
                label += f", {thresholds or 'no thresholds'}"
            seen[label] = seen.get(label, 0) + 1
            labels[run] = label if seen[label] == 1 else f"{label} (repeat {seen[label]})"
    return labels


def _bar_groups(ax, groups: list[tuple[str, dict]], methods: list[str], metric: str) -> None:
    """Grouped bars: groups = [(label, {method: (value, low, high)})], one fixed slot per method."""
    width = 0.8 / max(1, len(methods))
    for k, method in enumerate(methods):
        style = method_style(method)
        xs, values = [], []
        for g, (_, cells) in enumerate(groups):
            if method in cells and cells[method][0] is not None:
                xs.append(g - 0.4 + width * (k + 0.5))
                values.append(cells[method])
        if not xs:
            continue
        ax.bar(xs, [v[0] for v in values], width=width * 0.92, color=style["color"], label=style["label"])
        spread = [(x, v) for x, v in zip(xs, values) if v[1] is not None]  # no caps where no interval is shown
        if spread:
            ys, cells = [v[0] for _, v in spread], [v for _, v in spread]
            ax.errorbar(
                [x for x, _ in spread], ys, yerr=_errorbars(cells), fmt="none", ecolor="0.15", lw=0.8, capsize=1.5
            )
    ax.set_xticks(range(len(groups)), [label for label, _ in groups], fontsize=8)
    if metric.startswith("speedup"):
        ax.axhline(1.0, color="0.3", lw=0.8, ls=":")
    ax.set_ylabel(AXES.get(metric, metric), fontsize=8)
    ax.grid(axis="y", alpha=0.25)


# ---- the figures ------------------------------------------------------------------------------------------------


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
                _interval(runs[0], method, metric, y) if len(runs) == 1 and method != "ar" else (y, None, None)
                for runs, y in zip(group["runs"], ys)
            ]
            if any(c[1] is not None for c in cells):
                ax.errorbar(xs, ys, yerr=_errorbars(cells), fmt="none", ecolor=style["color"], lw=0.8, alpha=0.6)
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
        _frontier(ax, everything)
        if metric.startswith("speedup"):
            ax.axhline(1.0, color="0.3", lw=0.8, ls=":")
        _nodes_axis(ax, [p[0] for p in everything])
        ax.set_ylabel(AXES[metric])
        ax.grid(alpha=0.25)
        _title(ax, f"{AXES[metric].split(' (')[0]} against verified nodes per step (labels: budget K)", rows, True)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
        fig.tight_layout()
        written += _save(fig, out, f"pareto_{metric}")
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
        return {r.method: _interval(r.run, r.method, metric, getattr(r, metric)) for r in group.itertuples()}

    def name(model, dataset):
        return f"{model} / {dataset_label(dataset)}" if several_models else dataset_label(dataset)

    sweep = data.groupby(["model", "dataset"])["run"].nunique().max() > 1
    if not sweep:
        groups = [(name(m, d), cells(data[(data["model"] == m) & (data["dataset"] == d)])) for m, d in panels]
        fig, axes = plt.subplots(figsize=(max(7.0, 0.18 * len(methods) * len(groups) + 2), 4.6), squeeze=False)
        _bar_groups(axes[0][0], groups, methods, metric)
        plt.setp(axes[0][0].get_xticklabels(), rotation=20, ha="right")
    else:
        n_groups = max(data[(data["model"] == m) & (data["dataset"] == d)]["run"].nunique() for m, d in panels)
        fig, axes = plt.subplots(
            len(panels), 1, figsize=(max(7.0, 0.2 * len(methods) * n_groups + 2), 3.4 * len(panels)), squeeze=False
        )
        for ax, (m, d) in zip(axes[:, 0], panels):
            panel = data[(data["model"] == m) & (data["dataset"] == d)]
            runs = sorted(panel["run"].unique(), key=lambda r: list(settings).index(r))
            _bar_groups(ax, [(settings[r], cells(panel[panel["run"] == r])) for r in runs], methods, metric)
            ax.set_title(name(m, d), fontsize=9)
            ax.set_xlabel("setting (budget K = verified nodes allowed per step; thresholds)", fontsize=8)
    _title(axes[0][0], f"{AXES[metric]}, 95% intervals over prompts (from {MIN_N} prompts)", rows)
    fig.tight_layout()
    _legend_below(fig, *_handles(axes))
    return _save(fig, out, f"bars_{metric}")


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
        overall = {r.method: _interval(run, r.method, metric, getattr(r, metric)) for r in group.itertuples()}
        groups = [(f"all prompts\n(n={int(group['n_prompts'].max())})", overall)]
        groups += [
            (f"{c}\n(n={n[c]})", {m: _interval(run, m, metric, None, c) for m in group["method"]}) for c in categories
        ]
        first = group.iloc[0]
        name = f"{first['model']} / {dataset_label(first['dataset'])}, {settings[run]}"
        (panels if len(categories) > 1 else single).append((name, groups[:1] if len(categories) <= 1 else groups))
    if not panels:
        panels, single = single, []
    width = max(7.0, 0.16 * len(methods) * max(len(g) for _, g in panels) + 2)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.0 * len(panels) + 0.8), squeeze=False)
    for ax, (name, groups) in zip(axes[:, 0], panels):
        _bar_groups(ax, groups, methods, metric)
        ax.set_title(name, fontsize=9)
    title = f"{AXES[metric]} per prompt category, 95% intervals over prompts (from {MIN_N} prompts)\n{_context(rows)}"
    if single:
        title += "\nruns of one category (see bars_" + metric + "): " + "; ".join(name for name, _ in single)
    _suptitle_layout(fig, title, 130)
    _legend_below(fig, *_handles(axes))
    return _save(fig, out, f"category_{metric}")


def _handles(axes) -> tuple[list, list]:
    """Legend entries of every panel, each label once."""
    found: dict = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    return list(found.values()), list(found)


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
    context = _context(steps if "hardware" in steps else steps.assign(hardware=None)) if not steps.empty else ""
    _suptitle_layout(fig, f"Tokens committed per step (accepted + bonus), all runs pooled\n{context}")
    return _save(fig, out, "accept_histograms")


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
    context = _context(steps if "hardware" in steps else steps.assign(hardware=None)) if not steps.empty else ""
    ax.set_title(
        _wrap(f"Retrieval's share of accepted tokens by pruning stage\n{context}", 100),
        fontsize=9,
    )
    fig.tight_layout()
    return _save(fig, out, "retrieval_by_stage")


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
    context = _context(steps if "hardware" in steps else steps.assign(hardware=None)) if not steps.empty else ""
    ax.set_title(
        _wrap(f"Time per verification step, all runs pooled\n{context}", 100),
        fontsize=9,
    )
    fig.tight_layout()
    return _save(fig, out, "time_split")


# ---- the paper's relative claims beside the same ratios measured here -----------------------------------------

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
    import pandas as pd

    from graft.analysis.stats import ratio_interval

    settings = run_settings(rows) if not rows.empty else {}
    table = []
    for (method, over), name in COMPARISONS.items():
        found = []
        for run, group in rows.groupby("run", sort=False):
            speed = dict(zip(group["method"], group["speedup_wall"]))
            if method not in speed or over not in speed:
                continue
            first = group.iloc[0]
            found.append((run, first, speed))
        found.sort(key=lambda f: (f[1]["model"], f[1]["dataset"], _setting(rows[rows["run"] == f[0]])[0] or 0, f[0]))
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
        for runs, model, dataset, hardware, setting, speeds in entries:
            records = [r for run in runs for r in run_records(run)]
            try:
                measured = ratio_interval(records, method, over)
            except (KeyError, TypeError):
                measured = {"value": None, "low": None, "high": None, "n": 0}
            if measured["value"] is None:  # records without totals: the summaries' ratio (mean over runs)
                ratios = [s[method] / s[over] for s in speeds if s[over]]
                measured = {"value": sum(ratios) / len(ratios) if ratios else None, "low": None, "high": None, "n": 0}
            claim = _claim_for(claims, method, over, dataset)
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
            )
    return pd.DataFrame(table)


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
    import pandas as pd
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    table = relative_claims(rows, claims)
    matched = []
    for pub in published.itertuples():
        if pub.speedup != pub.speedup:  # NaN: a relative claim with no absolute figure
            continue
        mine = rows[(rows["model"] == pub.model) & (rows["method"] == pub.method) & (rows["dataset"] == pub.dataset)]
        mine = mine[mine["temperature"] == pub.temperature]
        if not mine.empty:
            label = f"{pub.paper}: {pub.model} {method_style(pub.method)['label']} {dataset_label(pub.dataset)}"
            matched.append((label, float(pub.speedup), float(mine["speedup_wall"].mean()), pub.method))

    if table.empty and claims is not None and len(claims):  # nothing measured: the claims alone, listed
        table = pd.DataFrame(
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
                    "published": _number(c.value),
                    "published_low": _number(c.low),
                    "published_high": _number(c.high),
                    "published_about": f"{c.model if c.model == c.model else 'unnamed model'}, {c.dataset}",
                    "published_source": c.source,
                }
                for c in claims.itertuples()
            ]
        )
    comparisons = list(dict.fromkeys(table["comparison"])) if not table.empty else []
    heights = [max(1.4, 0.32 * (table["comparison"] == c).sum() + 0.9) for c in comparisons]
    if matched:
        heights.append(max(1.6, 0.42 * len(matched) + 0.9))
    if not heights:
        heights = [1.6]
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(9.0, sum(heights) + 1.2), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    axes = axes[:, 0]
    for ax, comparison in zip(axes, comparisons):
        part = table[table["comparison"] == comparison].reset_index(drop=True)
        method = part["method"].iloc[0]
        style = method_style(method)
        ys = list(range(len(part)))[::-1]
        values = [(r.ratio, r.low, r.high) for r in part.itertuples()]
        have = [(y, v) for y, v in zip(ys, values) if v[0] is not None]
        if have:
            ax.errorbar(
                [v[0] for _, v in have],
                [y for y, _ in have],
                xerr=_errorbars([v for _, v in have]),
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
    if comparisons:
        axes[len(comparisons) - 1].set_xlabel(
            "Ratio of speedups (wall clock): mean tokens/s of the first method / the second's on the same prompts"
        )
    if matched:
        ax = axes[-1]
        ys = range(len(matched))
        ax.barh(
            [y + 0.2 for y in ys], [m[1] for m in matched], height=0.4, color=PUBLISHED, alpha=0.5, label="published"
        )
        colours = [method_style(m[3])["color"] for m in matched]
        ax.barh([y - 0.2 for y in ys], [m[2] for m in matched], height=0.4, color=colours)
        ax.set_yticks(list(ys), [m[0] for m in matched], fontsize=7)
        mine = Patch(facecolor="white", edgecolor="0.3", label="this harness (in the method's colour)")
        ax.legend(handles=[*ax.get_legend_handles_labels()[0], mine], fontsize=7, loc="lower right")
        ax.set_xlabel("Speedup over autoregressive (wall clock, x), where a run matches a published setting")
    elif not comparisons:
        axes[0].axis("off")
        axes[0].text(0.5, 0.5, "no published claim to set beside these runs", ha="center", va="center")
    handles = [
        Line2D(
            [], [], marker="o", color="0.3", ls="none", label=f"measured here, 95% interval over prompts (from {MIN_N})"
        ),
        Line2D([], [], ls="--", color=PUBLISHED, label="published ratio"),
        Patch(color=PUBLISHED, alpha=0.3, label="published range (or side of 1)"),
    ]
    _suptitle_layout(fig, f"The paper's relative claims beside the same ratios measured here\n{_context(rows)}")
    _legend_below(fig, handles, [h.get_label() for h in handles], ncol=3)
    written = _save(fig, out, "beside_paper")
    table.to_csv(Path(out) / "beside_paper.csv", index=False)
    return written


def batch_scaling(rows, out: Path) -> list[Path]:
    """Per (model, dataset) with runs at more than one batch size (graft/analysis/tables.py: batch_rows): left,
    each method's throughput over batched AR's at the same batch size against the batch size, with the
    per-sequence speedup_wall's 95% interval over prompts as a bar where the run has one; right, throughput
    (new tokens per second over the whole batch) against the batch size, AR's included."""
    written = []
    if rows.empty or rows["batch_size"].nunique() < 2:
        return written
    from graft.analysis.tables import batch_series, is_ar

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
        _legend_below(fig, handles, labels)
        setting = f"{new_tokens} new tokens" + (f", temperature {temperature:g}" if temperature else "")
        setting += f", {stream} stream" if stream else ""
        title = f"{model} / {dataset_label(dataset)} on {group['hardware'].iloc[0]}: batch scaling ({setting})"
        _suptitle_layout(fig, title)
        # one file per series: the settings that split series name it
        suffix = (
            f"_{new_tokens}tok"
            + (f"_t{temperature:g}" if temperature else "")
            + ("_groups" if stream == "groups of 2B" else "")
        )
        written += _save(fig, out, f"batch_scaling_{model}_{dataset}{suffix}")
    return written
