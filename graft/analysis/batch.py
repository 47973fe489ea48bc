"""Runs at several batch sizes (run.batch_size) as pandas tables: each (run, method)'s throughput over the
whole batch and its ratio to AR's at the same size (`batch_rows`), the series one batch-scaling figure draws
together (`batch_series`), and the table of them by batch size (`batch_table`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from graft.analysis.tables import method_rows
from graft.records.reader import _run_config, read_summary, run_sides


def batch_rows(paths, partial: bool = False) -> pd.DataFrame:
    """One row per (run, method) of runs at any run.batch_size: the batch size, the throughput over the whole
    batch (new tokens per wall second, prefill included; summary.json's `batch`, or at batch 1 the records' sums)
    and its ratio to AR's at the same size (`speedup_throughput`), beside method_rows' per-sequence columns
    (tau, speedup_wall and its interval)."""
    per_sequence = method_rows(paths, intervals=True, partial=partial)
    if per_sequence.empty:
        return per_sequence
    rows = []
    for run in dict.fromkeys(per_sequence["run"]):
        summary = read_summary(Path(run))
        batch = summary.get("batch")
        new_tokens = (_run_config(Path(run)).get("run") or {}).get("max_new_tokens")
        # how the batch was kept full: a steady stream of >= 4 B sequences, or (older runs) groups of 2 B drained
        # in turn; batch 1 runs one sequence at a time, which any series may start from
        stream = None if not batch else "steady" if batch.get("stream_repeats") is not None else "groups of 2B"
        peer = (summary.get("peer") or {}).get("batch_throughput")
        if peer:  # a peer engine's AR at several batch sizes (graft/peers: --batch-sizes), a steady stream each
            label = summary.get("baseline_label", "ar")
            points = [(p["batch_size"], {label: {"throughput_tokens_per_s": p["tokens_per_s"]}}) for p in peer]
            stream = "steady"
        elif batch:
            found = {("ar" if role == "baseline" else role): row for role, row in batch["roles"].items()}
            points = [(batch["batch_size"], found)]
        else:  # batch 1: each role's new tokens over its wall seconds, summed over the records
            sums = {}
            for _, _, method, side in run_sides(Path(run)):
                totals = side.get("totals") or {}  # records written by hand (tests) may carry none
                into = sums.setdefault(method, [0, 0.0])
                into[0] += totals.get("new_tokens", 0)
                into[1] += totals.get("wall_s", 0.0)
            points = [(1, {m: {"throughput_tokens_per_s": n / s if s else None} for m, (n, s) in sums.items()})]
        for size, found in points:
            base = (found.get("ar") or {}).get("throughput_tokens_per_s")
            for method, row in found.items():
                throughput = row.get("throughput_tokens_per_s")
                rows.append(
                    {
                        "run": run,
                        "method": method,
                        "batch_size": size,
                        "throughput_tokens_per_s": throughput,
                        "speedup_throughput": throughput / base if throughput and base and not is_ar(method) else None,
                        "latency_tokens_per_s_p50": row.get("latency_tokens_per_s_p50"),
                        "steady_sequences_per_step": row.get("steady_sequences_per_step"),
                        "max_new_tokens": new_tokens,
                        "stream": stream,
                    }
                )
    return per_sequence.merge(pd.DataFrame(rows), on=["run", "method"], how="inner")


def is_ar(method: str) -> bool:
    """AR's row: this harness's (`ar`) or another system's (`ar (vllm)`, `ar (imported)`)."""
    return method == "ar" or method.startswith("ar (")


def batch_series(rows: pd.DataFrame):
    """(model, dataset, temperature, max_new_tokens, stream) and its rows: the runs one batch-size series may draw
    together. Runs that differ in temperature, answer length or how their batch was kept full (a steady stream, or
    groups drained in turn) are never one series; a batch-1 run joins every series of its other settings."""
    keys = ["model", "dataset", "temperature", "max_new_tokens"]
    for key, group in rows.groupby(keys, dropna=False):
        streams = sorted({s for s in group["stream"] if isinstance(s, str)}) or [None]
        for stream in streams:
            yield (*key, stream), group[group["stream"].isna() | (group["stream"] == stream)]


def batch_table(rows: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """rows = methods, columns = batch sizes; cells "throughput speedup over batched AR / tau", AR's row its
    throughput in tokens/s."""
    methods = [m for m in (order or sorted(set(rows["method"]))) if m in set(rows["method"])]
    cells = {}
    for row in rows.itertuples():
        if is_ar(row.method):
            text = f"{row.throughput_tokens_per_s:.1f} tok/s"
        else:
            speed = (
                "-"
                if row.speedup_throughput is None or pd.isna(row.speedup_throughput)
                else f"{row.speedup_throughput:.2f}x"
            )
            text = f"{speed} / {row.tau:.2f}"
        cells.setdefault(row.method, {})[f"B={row.batch_size}"] = text
    columns = [f"B={b}" for b in sorted(set(rows["batch_size"]))]
    return pd.DataFrame.from_dict(cells, orient="index").reindex(index=methods, columns=columns).fillna("-")
