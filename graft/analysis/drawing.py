"""The parts every figure shares: the Pareto frontier, the nodes-per-step axis, titles that name the model,
datasets and hardware, legends below the panels, grouped bars with 95% intervals, and saving as PNG and PDF."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from graft.analysis.styles import AXES, dataset_label, method_style  # noqa: E402


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


def nodes_axis(ax, xs) -> None:
    """Verified nodes per step on a log2 axis with plain numbers when it spans more than a factor of 4."""
    xs = [x for x in xs if x and x > 0]
    if xs and max(xs) / min(xs) > 4:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(AXES["avg_nodes_per_step"])


def draw_frontier(ax, points: list[tuple[float, float]]) -> None:
    """The overall Pareto frontier as dashed grey steps, held flat to the costliest point."""
    front = [points[i] for i in pareto_front(points)]
    if front:
        xs, ys = [p[0] for p in front], [p[1] for p in front]
        right = max(p[0] for p in points)
        if right > xs[-1]:
            xs, ys = xs + [right], ys + [ys[-1]]
        ax.step(xs, ys, where="post", ls="--", lw=1.2, color="0.45", zorder=1, label="Pareto frontier (all methods)")


def wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def save_figure(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


def rows_context(rows, mean: bool = False) -> str:
    """The model, the datasets ("mean over N datasets (...)" when `mean`) and the hardware of some rows."""
    models = ", ".join(sorted(set(rows["model"])))
    datasets = sorted(set(rows["dataset"]))
    hardware = "; ".join(sorted({str(h) for h in rows["hardware"] if h is not None and h == h})) or "unknown hardware"
    data = ", ".join(dataset_label(d) for d in datasets)
    if mean and len(datasets) > 1:
        data = f"mean over {len(datasets)} datasets ({data})"
    return f"{models} / {data} on {hardware}"


def suptitle_layout(fig, text: str, width: int = 110) -> None:
    """A figure title over several panels, and the panels laid out below it."""
    text = wrap(text, width)
    fig.suptitle(text, fontsize=9)
    lines = text.count("\n") + 1
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.17 * lines + 0.08) / fig.get_figheight()))


def panel_title(ax, what: str, rows, mean: bool = False) -> None:
    ax.set_title(wrap(f"{what}\n{rows_context(rows, mean)}"), fontsize=9)


def legend_below(fig, handles, labels, ncol: int = 5) -> None:
    if handles:
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8, frameon=False)


def errorbars(values: list[tuple]) -> list[list[float]]:
    low = [v - lo if lo is not None else 0.0 for v, lo, _ in values]
    high = [hi - v if hi is not None else 0.0 for v, _, hi in values]
    return [low, high]


def bar_groups(ax, groups: list[tuple[str, dict]], methods: list[str], metric: str) -> None:
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
                [x for x, _ in spread], ys, yerr=errorbars(cells), fmt="none", ecolor="0.15", lw=0.8, capsize=1.5
            )
    ax.set_xticks(range(len(groups)), [label for label, _ in groups], fontsize=8)
    if metric.startswith("speedup"):
        ax.axhline(1.0, color="0.3", lw=0.8, ls=":")
    ax.set_ylabel(AXES.get(metric, metric), fontsize=8)
    ax.grid(axis="y", alpha=0.25)


def legend_handles(axes) -> tuple[list, list]:
    """Legend entries of every panel, each label once."""
    found: dict = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    return list(found.values()), list(found)
