"""What the figures read from a run directory: its prompt records and its 95% intervals over prompts
(graft.analysis.stats, as graft.analysis.tables gives them), each cached per run until its summary.json changes,
and the label of each run's setting (budget K, thresholds)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from graft.analysis.stats import shown as stats_shown


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
    from graft.analysis.tables import run_intervals as intervals_of
    from graft.records.reader import RecordError

    try:
        return intervals_of(Path(run))
    except RecordError:
        return {}


def run_intervals(run) -> dict:
    """The run's intervals as the tables give them (graft.analysis.tables.run_intervals), {} when its records lack
    what they read."""
    summary = Path(run) / "summary.json"
    return _intervals(str(run), summary.stat().st_mtime_ns if summary.exists() else 0)


def interval_cell(run, method: str, metric: str, value, category: str | None = None) -> tuple:
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


def run_setting(group) -> tuple:
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
        settings = {run: run_setting(group) for run, group in runs.groupby("run", sort=False)}
        vary = len({s[1] for s in settings.values()}) > 1
        seen: dict[str, int] = {}
        for run, (budget, thresholds) in sorted(settings.items(), key=lambda kv: (kv[1][0] or 0, str(kv[1][1]))):
            label = f"K={budget}" if budget is not None else "-"
            if vary:
                label += f", {thresholds or 'no thresholds'}"
            seen[label] = seen.get(label, 0) + 1
            labels[run] = label if seen[label] == 1 else f"{label} (repeat {seen[label]})"
    return labels
