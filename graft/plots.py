"""Figures from runs (matplotlib, no display needed): a comparison's Pareto figure, and for sweeps the
Pareto frontiers, speedup bars, accepted-length histograms, retrieval's share by pruning stage, the time
split and the published numbers beside ours. Titles name the model, dataset and hardware; axes their units."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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


def plot_comparison_pareto(summary: dict, path: str | Path, metric: str = "speedup_decode") -> Path:
    """One point per method of a comparison: `metric` against verified nodes per step; the frontier drawn."""
    rows = {name: row for name, row in summary["rows"].items() if row.get(metric) is not None}
    names = list(rows)
    points = [(rows[n]["avg_nodes_per_step"], rows[n][metric]) for n in names]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.scatter([p[0] for p in points], [p[1] for p in points], color="tab:blue")
    for name, (x, y) in zip(names, points):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=9)
    front = pareto_front(points)
    ax.plot(
        [points[i][0] for i in front], [points[i][1] for i in front], "--", color="tab:orange", label="Pareto frontier"
    )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("verified nodes per step (root included)")
    ax.set_ylabel(f"{metric} (x, against the autoregressive baseline)")
    ax.set_title(f"{summary['model']} / {summary['dataset']} on {hardware_name(summary['hardware'])}", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return paths


def _title(rows) -> str:
    models = ", ".join(sorted(set(rows["model"])))
    datasets = ", ".join(sorted(set(rows["dataset"])))
    return textwrap.fill(f"{models} / {datasets} on {rows['hardware'].iloc[0]}", 90)


MARKERS = "os^Dv<>Ph*X"
# every figure `python -m graft.report plot` writes (PNG and PDF each)
FIGURES = (
    "pareto_speedup_decode",
    "pareto_tau",
    "bars_speedup_wall",
    "accept_histograms",
    "retrieval_by_stage",
    "time_split",
    "beside_paper",
)


def _style(k: int) -> dict:
    """A distinct colour and marker for the k-th method (20 colours x 11 markers)."""
    return {"color": plt.get_cmap("tab20")(k % 20), "marker": MARKERS[k % len(MARKERS)]}


def pareto_figures(rows, out: Path) -> list[Path]:
    """Speedup and tau against verified nodes per step, one point per (method, budget, thresholds) averaged
    over datasets, each method's own frontier drawn through its points."""
    written = []
    keys = ["method", "budget"] + (["thresholds"] if "thresholds" in rows else [])
    points = rows.groupby(keys, dropna=False)[["avg_nodes_per_step", "speedup_decode", "tau"]].mean().reset_index()
    for metric, label in [("speedup_decode", "decode speedup (x, against AR)"), ("tau", "tau (tokens per step)")]:
        fig, ax = plt.subplots(figsize=(6.8, 4.6))
        for k, (method, group) in enumerate(points.groupby("method")):
            xy = list(zip(group["avg_nodes_per_step"], group[metric]))
            style = _style(k)
            ax.scatter(*zip(*xy), label=method, s=28, **style)
            front = pareto_front(xy)
            ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], "-", lw=1, color=style["color"])
        ax.set_xlabel("verified nodes per step (root included)")
        ax.set_ylabel(label)
        ax.set_title(_title(rows), fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        written += _save(fig, out, f"pareto_{metric}")
    return written


def speedup_bars(rows, out: Path, metric: str = "speedup_wall") -> list[Path]:
    """Per-dataset speedup of every method (bars), the AR line at 1."""
    table = rows.pivot_table(index="dataset", columns="method", values=metric, aggfunc="mean")
    fig, ax = plt.subplots(figsize=(max(6.4, 1.2 * len(table)), 4.4))
    table.plot.bar(ax=ax, width=0.8, color=[_style(k)["color"] for k in range(len(table.columns))])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel(f"{metric} (x, against AR)")
    ax.set_xlabel("dataset")
    ax.set_title(_title(rows), fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return _save(fig, out, f"bars_{metric}")


def accept_histograms(steps, out: Path) -> list[Path]:
    """Tokens committed per step (accepted + bonus), one histogram per method."""
    methods = [m for m in steps["method"].unique() if m != "ar"]
    fig, axes = plt.subplots(
        1, max(1, len(methods)), figsize=(2.6 * max(1, len(methods)), 3.2), sharey=True, squeeze=False
    )
    top = int(steps["accepted"].max())
    for ax, method in zip(axes[0], methods):
        values = steps.loc[steps["method"] == method, "accepted"]
        ax.hist(values, bins=range(1, top + 2), align="left", rwidth=0.85)
        ax.set_title(method, fontsize=9)
        ax.set_xlabel("tokens committed per step")
    axes[0][0].set_ylabel("steps")
    fig.tight_layout()
    return _save(fig, out, "accept_histograms")


def retrieval_by_stage(steps, out: Path) -> list[Path]:
    """Share of accepted tokens that retrieval proposed, per pruning stage, for methods that record stages."""
    staged = steps.dropna(subset=["stage"])
    staged = staged[staged["method"] != "ar"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if not staged.empty:
        sums = staged.groupby(["method", "stage"])[["accepted_draft", "accepted_retrieved"]].sum()
        share = (sums["accepted_retrieved"] / (sums["accepted_draft"] + sums["accepted_retrieved"])).unstack("stage")
        share.plot.bar(ax=ax)
    ax.set_ylabel("accepted tokens from retrieval (share)")
    ax.set_xlabel("method")
    ax.set_title("retrieval's share of accepted tokens by pruning stage", fontsize=9)
    fig.tight_layout()
    return _save(fig, out, "retrieval_by_stage")


def time_split(steps, out: Path) -> list[Path]:
    """Where a step's time goes, per method: draft, verify and the rest (ms per step, stacked)."""
    ms = steps.groupby("method")[["draft_ms", "verify_ms", "other_ms"]].mean()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ms.plot.bar(stacked=True, ax=ax)
    ax.set_ylabel("milliseconds per step")
    ax.set_xlabel("method")
    ax.set_title("time per verification step", fontsize=9)
    fig.tight_layout()
    return _save(fig, out, "time_split")


def beside_paper(rows, published, out: Path) -> list[Path]:
    """Each published speedup beside this harness's mean for the same model, method, dataset and
    temperature; published figures without a matching run are listed in the figure, not plotted."""
    matched, unmatched = [], []
    for pub in published.itertuples():
        if pub.speedup != pub.speedup:  # NaN: a relative claim with no absolute figure
            continue
        mine = rows[(rows["model"] == pub.model) & (rows["method"] == pub.method) & (rows["dataset"] == pub.dataset)]
        mine = mine[mine["temperature"] == pub.temperature]
        label = f"{pub.paper}: {pub.model or '?'} {pub.method} {pub.dataset}"
        if mine.empty:
            unmatched.append(label)
        else:
            matched.append((label, float(pub.speedup), float(mine["speedup_wall"].mean())))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    if matched:
        ys = range(len(matched))
        ax.barh([y + 0.2 for y in ys], [m[1] for m in matched], height=0.4, label="published")
        ax.barh([y - 0.2 for y in ys], [m[2] for m in matched], height=0.4, label="this harness")
        ax.set_yticks(list(ys), [m[0] for m in matched], fontsize=7)
        ax.legend(fontsize=8)
        ax.set_xlabel("speedup (x, against autoregressive decoding)")
    else:
        ax.axis("off")
    note = (
        f"no run here matches these {len(unmatched)} published figures (model, method, dataset, temperature):\n"
        + "\n".join(unmatched[:14])
        + ("\n..." if len(unmatched) > 14 else "")
    )
    ax.set_title(f"published speedups beside this harness ({_title(rows)})", fontsize=9)
    if unmatched:
        fig.text(0.01, 0.01, note, fontsize=6, va="bottom", family="monospace")
    fig.tight_layout()
    return _save(fig, out, "beside_paper")
