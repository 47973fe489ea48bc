"""The console table printed at the end of a run, with each metric's definition beside its value."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

ROWS = [
    ("n_prompts", "{}"),
    ("tau", "{:.2f}"),
    ("baseline_tau", "{:.2f}"),
    ("tokens_per_s", "{:.1f}"),
    ("baseline_tokens_per_s", "{:.1f}"),
    ("speedup_wall", "{:.3f}x"),
    ("speedup_wall_median", "{:.3f}x"),
    ("speedup_decode", "{:.3f}x"),
    ("lossless", "{}"),
    ("avg_nodes_per_step", "{:.1f}"),
    ("retrieved_nodes_per_step", "{:.1f}"),
    ("retrieval_share", "{:.1%}"),
    ("graft_overhead", "{:.1%}"),
    ("ms_per_step", "{:.1f}"),
    ("baseline_ms_per_step", "{:.1f}"),
    ("loop_overhead", "{:.1%}"),
    ("baseline_loop_overhead", "{:.1%}"),
    ("mean_prompt_tokens", "{:.0f}"),
    ("mean_prefill_s", "{:.2f}"),
    ("prefill_tokens_per_s", "{:.0f}"),
]


def print_summary(summary: dict, out_dir: str) -> None:
    table = Table(
        title=f"{summary['method']} on {summary['model']} / {summary['dataset']}  ({summary['hardware'].get('cpu') if summary['hardware'].get('device') == 'cpu' else summary['hardware'].get('gpu', summary['hardware'].get('device'))})"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("definition")
    definitions = summary.get("definitions", {})
    for key, fmt in ROWS:
        value = summary.get(key)
        text = "-" if value is None else fmt.format(value)
        table.add_row(key, text, definitions.get(key, ""))
    if summary.get("score"):
        sc = summary["score"]
        table.add_row(
            sc["metric"], f"{sc['method']:.3f} (baseline {sc['baseline']:.3f})", f"over {sc['n_scored']} scored prompts"
        )
    if summary.get("n_skipped"):
        table.add_row("n_skipped", str(summary["n_skipped"]), "prompts longer than the context allows")
    console = Console()
    console.print(table)
    console.print(f"records: {out_dir}/samples.jsonl  summary: {out_dir}/summary.json")


COMPARISON_COLUMNS = [
    ("tau", "{:.2f}"),
    ("speedup_wall", "{:.3f}x"),
    ("speedup_decode", "{:.3f}x"),
    ("avg_nodes_per_step", "{:.1f}"),
    ("tokens_per_s", "{:.1f}"),
    ("lossless", "{}"),
]


def print_comparison(summary: dict, out_dir: str, wall_s: float | None = None) -> None:
    """Rows = the baseline and the methods, columns = the headline metrics, definitions below."""
    hardware = summary["hardware"]
    where = hardware.get("cpu") if hardware.get("device") == "cpu" else hardware.get("gpu", hardware.get("device"))
    table = Table(title=f"{summary['model']} / {summary['dataset']}, {summary['n_prompts']} prompts ({where})")
    table.add_column("method")
    for key, _ in COMPARISON_COLUMNS:
        table.add_column(key, justify="right")
    for name, row in summary["rows"].items():
        cells = ["-" if row.get(key) is None else fmt.format(row[key]) for key, fmt in COMPARISON_COLUMNS]
        table.add_row(f"{name} (baseline)" if name == summary["baseline"] else name, *cells)
    console = Console(width=max(120, Console().width))
    console.print(table)
    definitions = summary.get("definitions", {})
    for key, _ in COMPARISON_COLUMNS:
        console.print(f"  {key}: {definitions.get(key, '')}")
    if summary.get("n_skipped"):
        console.print(f"  n_skipped: {summary['n_skipped']} prompts longer than the context allows")
    if wall_s is not None:
        console.print(f"wall time: {wall_s:.0f} s (model load, warm-up and every method included)")
    console.print(
        f"records: {out_dir}/samples.jsonl  summaries: {out_dir}/summary.json, {out_dir}/summaries/<method>.json"
    )
    console.print(f"Pareto figure: {out_dir}/pareto.png")
