"""Figures from run summaries (matplotlib, no display needed): the Pareto frontier of a comparison and
of budget sweeps. Every figure names its model, dataset and hardware in the title and its units on the axes."""

from __future__ import annotations

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
