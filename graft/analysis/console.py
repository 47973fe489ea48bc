"""The console table printed at the end of a run, with each metric's definition beside its value."""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from graft.analysis.stats import MIN_N_FOR_INTERVAL, format_interval, shown

INTERVAL_KEYS = ("tau", "speedup_wall", "speedup_decode")  # the metrics graft/analysis/stats.py gives an interval of
INTERVAL_NOTE = f"\\[low, high]: 95% interval over prompts (paired jackknife-t, from {MIN_N_FOR_INTERVAL} prompts; all: by category)"
NO_INTERVAL_NOTE = f"no 95% interval: fewer than {MIN_N_FOR_INTERVAL} prompts (graft/analysis/stats.py)"


def interval_note(intervals: dict) -> str | None:
    """The line under a table that says what its brackets are, or why it has none."""
    if not intervals:
        return None
    entries = [e for found in intervals.values() for scope in found.values() for e in _entries(scope)]
    return INTERVAL_NOTE if any(shown(e) for e in entries) else NO_INTERVAL_NOTE


def _entries(scope: dict):
    """The interval entries of "all" ({metric: entry}) or of "categories" ({category: {metric: entry}})."""
    for value in (scope or {}).values():
        if isinstance(value, dict) and "value" in value:
            yield value
        elif isinstance(value, dict):
            yield from value.values()


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
    spread = (summary.get("intervals") or {}).get(summary["method"]) or {}
    for key, fmt in ROWS:
        value = summary.get(key)
        text = "-" if value is None else fmt.format(value)
        if key in INTERVAL_KEYS:
            text = with_interval(text, spread.get("all", {}).get(key))
        table.add_row(key, text, definitions.get(key, ""))
    repeats = summary.get("repeats") or {}
    for key in INTERVAL_KEYS if repeats else ():
        table.add_row(f"{key} over repeats", repeat_cell(repeats.get(key), "x" if key != "tau" else ""), REPEATS_NOTE)
    if summary.get("score"):
        sc = summary["score"]
        table.add_row(
            sc["metric"], f"{sc['method']:.3f} (baseline {sc['baseline']:.3f})", f"over {sc['n_scored']} scored prompts"
        )
    if summary.get("n_skipped"):
        table.add_row("n_skipped", str(summary["n_skipped"]), "prompts longer than the context allows")
    console = Console()
    console.print(table)
    by_category = category_table(summary.get("intervals") or {}, [summary["method"]])
    if by_category is not None:
        wide_console(by_category).print(by_category)
    note = interval_note(summary.get("intervals") or {})
    if note:
        console.print(f"  {note}")
    if summary.get("batch"):
        console.print(batch_line(summary["batch"]))
    console.print(f"records: {out_dir}/samples.jsonl  summary: {out_dir}/summary.json")


def wide_console(*tables: Table | None, least: int = 0) -> Console:
    """A console wide enough for every table's cells on one line (an interval wrapped over two lines is hard to
    read), at least the terminal's width and `least`."""
    probe = Console(width=1000)
    needed = [Measurement.get(probe, probe.options, t).maximum for t in tables if t is not None]
    return Console(width=max(least, Console().width, *needed))


def with_interval(text: str, entry: dict | None) -> str:
    """`text` (a formatted value) followed by the 95% interval where there is one: "1.523x [1.41, 1.63]"."""
    if shown(entry):
        return f"{text} [{entry['low']:.2f}, {entry['high']:.2f}]"
    return text


REPEATS_NOTE = "mean (min-max) over run.repeats passes of every prompt: the machine's noise between runs"


def repeat_cell(spread: dict | None, unit: str = "x") -> str:
    """One ratio over the repeats (summary.json's `repeats`): "1.25x (1.22-1.29)"."""
    if not spread or spread.get("mean") is None:
        return "-"
    return f"{spread['mean']:.3f}{unit} ({spread['min']:.2f}-{spread['max']:.2f})"


def category_cell(entry: dict | None) -> str:
    """One method's speedup_wall with its interval, and tau, on one category: "1.52x [1.41, 1.63] / 2.31"."""
    if not entry:
        return "-"
    tau = entry["tau"]["value"]
    return f"{format_interval(entry['speedup_wall'])} / " + ("-" if tau is None else f"{tau:.2f}")


def category_table(intervals: dict, methods: list[str]) -> Table | None:
    """Rows = the run's categories, columns = `methods`, cells "speedup_wall [95% interval] / tau"; None when
    the run has fewer than two categories (the main table says it all)."""
    categories = sorted({c for m in methods for c in (intervals.get(m) or {}).get("categories", {})})
    if len(categories) < 2:
        return None
    rows = {c: [(intervals.get(m) or {}).get("categories", {}).get(c) for m in methods] for c in categories}
    shown = any(e and e["speedup_wall"].get("low") is not None for entries in rows.values() for e in entries)
    title = f"per category: speedup_wall{' [95% interval]' if shown else ''} / tau"  # none below MIN_N_FOR_INTERVAL
    table = Table(title=title, min_width=len(title))
    table.add_column("category")
    table.add_column("n", justify="right")
    for method in methods:
        table.add_column(method, justify="right")
    for category, entries in rows.items():
        n = next((e["speedup_wall"]["n"] for e in entries if e), None)
        cells = [category_cell(entry) for entry in entries]
        table.add_row(category, "-" if n is None else str(n), *cells)
    return table


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
    intervals = summary.get("intervals") or {}
    repeats = summary.get("repeats") or {}
    if repeats:
        table.add_column(f"speedup_wall over {repeats.get('R')} repeats", justify="right")
    for name, row in summary["rows"].items():
        cells = ["-" if row.get(key) is None else fmt.format(row[key]) for key, fmt in COMPARISON_COLUMNS]
        if name != summary["baseline"]:  # the baseline's ratios are 1 by definition
            spread = (intervals.get(name) or {}).get("all", {})
            cells = [
                with_interval(cell, spread.get(key)) if key in INTERVAL_KEYS else cell
                for cell, (key, _) in zip(cells, COMPARISON_COLUMNS)
            ]
        if repeats:
            found = (repeats.get("methods") or {}).get(name) or {}
            cells.append("-" if name == summary["baseline"] else repeat_cell(found.get("speedup_wall")))
        table.add_row(f"{name} (baseline)" if name == summary["baseline"] else name, *cells)
    methods = [name for name in summary["rows"] if name != summary["baseline"]]
    by_category = category_table(intervals, methods)
    console = wide_console(table, by_category, least=120)
    console.print(table)
    if by_category is not None:
        console.print(by_category)
    definitions = summary.get("definitions", {})
    for key, _ in COMPARISON_COLUMNS:
        console.print(f"  {key}: {definitions.get(key, '')}")
    note = interval_note(intervals)
    if note:
        console.print(f"  {note}")
    if repeats:
        console.print(f"  over repeats: {REPEATS_NOTE}")
    if summary.get("n_skipped"):
        console.print(f"  n_skipped: {summary['n_skipped']} prompts longer than the context allows")
    if summary.get("batch"):
        console.print(batch_line(summary["batch"]))
    if wall_s is not None:
        console.print(f"wall time: {wall_s:.0f} s (model load, warm-up and every method included)")
    console.print(
        f"records: {out_dir}/samples.jsonl  summaries: {out_dir}/summary.json, {out_dir}/summaries/<method>.json"
    )
    console.print(f"Pareto figure: {out_dir}/pareto.png")


def batch_line(batch: dict) -> str:
    """A batched run's throughput (new tokens per wall second over the whole batch, prefill included) per role,
    each method's over batched AR's at the same batch size; the per-prompt columns above are per-sequence."""
    parts = []
    for role, row in batch["roles"].items():
        name = "ar" if role == "baseline" else role
        ratio = row.get("speedup_throughput")
        parts.append(f"{name} {row['throughput_tokens_per_s']:.1f}" + (f" ({ratio:.2f}x)" if ratio else ""))
    return f"batch of {batch['batch_size']}: throughput tokens/s over the batch: " + ", ".join(parts)
