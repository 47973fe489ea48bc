"""95% bootstrap intervals over prompts for a run's headline ratios, overall and per category.

The same run moves by 5-20% from hour to hour on shared machines, so a ratio without an interval says little.
Each prompt is one paired observation (the method's side and the shared baseline's side of the same prompt);
resampling prompts with replacement (scipy.stats.bootstrap, paired, percentile method) gives the interval of:
- speedup_wall: mean tokens/s of the method / mean tokens/s of the baseline (summary.json's speedup_wall);
- speedup_decode: the baseline's decode seconds per committed token / the method's (summary's speedup_decode);
- tau: committed tokens / verification steps of the method (summary's tau).
The point value is the statistic on all prompts, so it equals the summary's figure.
"""

from __future__ import annotations

import numpy as np

from graft.metrics import record_sides

METRICS = ("speedup_wall", "speedup_decode", "tau")
CONFIDENCE = 0.95
RESAMPLES = 2000
COLUMNS = ("m_tps", "b_tps", "m_decode", "m_tokens", "m_steps", "b_decode", "b_tokens")


def _speedup_wall(m_tps, b_tps, m_decode, m_tokens, m_steps, b_decode, b_tokens, axis=-1):
    return m_tps.mean(axis=axis) / b_tps.mean(axis=axis)


def _speedup_decode(m_tps, b_tps, m_decode, m_tokens, m_steps, b_decode, b_tokens, axis=-1):
    base = b_decode.sum(axis=axis) / b_tokens.sum(axis=axis)
    return base / (m_decode.sum(axis=axis) / m_tokens.sum(axis=axis))


def _tau(m_tps, b_tps, m_decode, m_tokens, m_steps, b_decode, b_tokens, axis=-1):
    return m_tokens.sum(axis=axis) / m_steps.sum(axis=axis)


STATISTICS = {"speedup_wall": _speedup_wall, "speedup_decode": _speedup_decode, "tau": _tau}


def paired_rows(records: list[dict]) -> dict[str, list[dict]]:
    """{method: one row per finished prompt}: its category and the totals the statistics read, the method's
    side (m_*) beside the baseline's (b_*). A comparison's baseline appears as method `ar`."""
    rows: dict[str, list[dict]] = {}
    for record in records:
        # a single run's intervals are its method's alone; its own side is the baseline where it ran none (ar)
        comparison = "methods" in record
        sides = record_sides(record, record.get("_method") or "method", baseline="ar" if comparison else None)
        if not sides:
            continue
        base = record.get("baseline") or next(iter(sides.values()))
        b = base["totals"]
        for name, side in sides.items():
            m = side["totals"]
            rows.setdefault(name, []).append(
                {
                    "category": record.get("category") or "-",
                    "m_tps": m["tokens_per_s"],
                    "b_tps": b["tokens_per_s"],
                    "m_decode": m["decode_s"],
                    "m_tokens": m["step_tokens"],
                    "m_steps": m["steps"],
                    "b_decode": b["decode_s"],
                    "b_tokens": b["step_tokens"],
                }
            )
    return rows


def _with_interval(out: dict, data: tuple, statistic, seed: int) -> dict:
    """`out` with the 95% percentile interval of `statistic` over paired resamples of `data`'s prompts (left
    None where a resample gives no finite value)."""
    from scipy.stats import bootstrap

    with np.errstate(divide="ignore", invalid="ignore"):
        result = bootstrap(
            data,
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=RESAMPLES,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if np.isfinite(low) and np.isfinite(high):
        out["low"], out["high"] = low, high
    return out


def interval(rows: list[dict], metric: str, seed: int = 0) -> dict:
    """{"value", "low", "high", "n"} of `metric` over `rows`; low and high are None below two prompts or when
    every resample gives the same value."""
    data = tuple(np.asarray([r[c] for r in rows], dtype=float) for c in COLUMNS)
    statistic = STATISTICS[metric]
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(statistic(*data))
    out = {"value": value if np.isfinite(value) else None, "low": None, "high": None, "n": len(rows)}
    if len(rows) < 2 or out["value"] is None:
        return out
    return _with_interval(out, data, statistic, seed)


def intervals(records: list[dict], categories: bool = True) -> dict[str, dict]:
    """{method: {"all": {metric: interval}, "categories": {category: {metric: interval}}}} of a run's records
    (without "categories" unless `categories`)."""
    result = {}
    for method, rows in paired_rows(records).items():
        result[method] = {"all": {metric: interval(rows, metric) for metric in METRICS}}
        if not categories:
            continue
        by_category: dict[str, list[dict]] = {}
        for row in rows:
            by_category.setdefault(row["category"], []).append(row)
        result[method]["categories"] = {
            category: {metric: interval(group, metric) for metric in METRICS}
            for category, group in sorted(by_category.items())
        }
    return result


def summary_intervals(summary: dict, records: list[dict], categories: bool = True) -> dict[str, dict]:
    """A run's intervals: summary.json's `intervals` where the run recorded them, else computed from `records`
    (those of a single run named by its method)."""
    if isinstance(summary.get("intervals"), dict):
        return summary["intervals"]
    if summary.get("kind") != "comparison":
        records = [{**r, "_method": r.get("_method") or summary.get("method") or "method"} for r in records]
    return intervals(records, categories)


def interval_entries(spread: dict[str, dict]):
    """(method, category, metric, interval) of every interval in `spread`, category "all" for the whole run."""
    for method, found in spread.items():
        for category, metrics in {"all": found.get("all") or {}, **(found.get("categories") or {})}.items():
            for metric, entry in metrics.items():
                yield method, category, metric, entry


def format_interval(entry: dict | None, unit: str = "x") -> str:
    """ "1.52x [1.41, 1.63]" (or "1.52x" without an interval, "-" without a value)."""
    if not entry or entry.get("value") is None:
        return "-"
    text = f"{entry['value']:.2f}{unit}"
    if entry.get("low") is not None:
        text += f" [{entry['low']:.2f}, {entry['high']:.2f}]"
    return text


def _ratio(a_tps, b_tps, axis=-1):
    return a_tps.mean(axis=axis) / b_tps.mean(axis=axis)


def ratio_interval(records: list[dict], method: str, over: str, seed: int = 0) -> dict:
    """{"value", "low", "high", "n"} of `method`'s speedup_wall over `over`'s on the prompts where both
    finished (records of one comparison run, or of several pooled): both share the baseline, so the ratio is
    the mean tokens/s of `method` / that of `over` over the same prompts, and a paired bootstrap over prompts
    gives its interval (None below two prompts)."""
    pairs = []
    for record in records:
        sides = record_sides(record) if "methods" in record else {}  # the methods of a comparison, and `ar`
        if method in sides and over in sides:
            pairs.append((sides[method]["totals"]["tokens_per_s"], sides[over]["totals"]["tokens_per_s"]))
    data = tuple(np.asarray(column, dtype=float) for column in zip(*pairs)) if pairs else (np.array([]),) * 2
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(_ratio(*data)) if pairs else float("nan")
    out = {"value": value if np.isfinite(value) else None, "low": None, "high": None, "n": len(pairs)}
    if len(pairs) < 2 or out["value"] is None:
        return out
    return _with_interval(out, data, _ratio, seed)
