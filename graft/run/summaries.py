"""summary.json's parts beyond one method's summary (graft/records/metrics.py: summarize): a comparison's table of
headline metrics, one row per method, and the spread of each headline ratio over run.repeats."""

from __future__ import annotations

from graft.analysis.stats import METRICS
from graft.records.metrics import summarize
from graft.run.prompt_records import method_view


def add_repeats(summary: dict, records: list[dict], repeats: int, methods: list[str] | None) -> None:
    """summary.json's `repeats`: each headline ratio (stats.METRICS) summarised per repeat, and its mean, min,
    max and values over the repeats; a comparison's per method (under `methods` and in each method's summary)."""
    passes = [[r for r in records if r.get("repeat", 1) == k] for k in range(1, repeats + 1)]
    names = methods if methods is not None else [None]
    found = {}
    for name in names:
        per_repeat = [summarize([method_view(r, name) for r in group] if name else group, {}) for group in passes]
        found[name] = {"R": repeats, **{m: repeat_spread([s.get(m) for s in per_repeat]) for m in METRICS}}
    if methods is None:
        summary["repeats"] = found[None]
        return
    for name in methods:
        summary["methods"][name]["repeats"] = found[name]
    summary["repeats"] = {"R": repeats, "methods": {name: {m: found[name][m] for m in METRICS} for name in methods}}


def repeat_spread(values: list) -> dict:
    """{"mean", "min", "max", "values"} of one ratio over the repeats (None where a repeat has no value)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"mean": None, "min": None, "max": None, "values": values}
    return {"mean": sum(known) / len(known), "min": min(known), "max": max(known), "values": values}


COMPARISON_KEYS = (
    "tau",
    "speedup_wall",
    "speedup_decode",
    "avg_nodes_per_step",
    "tokens_per_s",
    "lossless",
    "retrieval_share",
    "ms_per_step",
    "n_prompts",
)


def comparison_summary(per_method: dict[str, dict], meta: dict) -> dict:
    """One row per method (the baseline first) of the headline metrics, plus every method's full summary."""
    first = next(iter(per_method.values()))
    baseline_row = {
        "tau": first["baseline_tau"],
        "speedup_wall": 1.0 if first["baseline_tokens_per_s"] else None,
        "speedup_decode": 1.0 if first["baseline_tokens_per_s"] else None,
        "avg_nodes_per_step": 1.0 if first["n_prompts"] else None,
        "tokens_per_s": first["baseline_tokens_per_s"],
        "lossless": None,
        "retrieval_share": None,
        "ms_per_step": first["baseline_ms_per_step"],
        "n_prompts": first["n_prompts"],
    }
    rows = {"ar": baseline_row, **{name: {k: s.get(k) for k in COMPARISON_KEYS} for name, s in per_method.items()}}
    return {
        **{k: v for k, v in meta.items() if k != "method"},
        "kind": "comparison",
        "method": "compare",
        "baseline": "ar",
        "n_prompts": first["n_prompts"],
        "n_skipped": first["n_skipped"],
        "rows": rows,
        "methods": per_method,
        "definitions": first["definitions"],
    }


def summarise(records: list[dict], meta: dict, *, configs: dict[str, dict], method: str, comparison: bool) -> dict:
    """summary.json of `records`: the summary of one method (`method`), or a comparison's of every method in
    `configs` (each method's settings, keyed by name)."""
    if not comparison:
        return summarize(records, {**meta, "method_config": configs[method]})
    per_method = {
        name: summarize(
            [method_view(r, name) for r in records], {**meta, "method": name, "method_config": configs[name]}
        )
        for name in configs
    }
    return comparison_summary(per_method, meta)
