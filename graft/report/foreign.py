"""Run folders of results this harness did not decode itself: answer files imported from Spec-Bench or EAGLE
(graft/report/specbench_import.py) and a peer engine's runs (graft/peers). Each is one comparison, its baseline the
other system's autoregressive decoding, laid out as this harness's comparison runs (samples.jsonl, summary.json,
run.json, summaries/) so `tables`, `plot` and `summarize` read it; numbers that the other system does not record
(decode time, tree sizes) are None, and everything else is computed as graft/records/metrics.py computes it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def side_of(turns: list[dict]) -> dict:
    """A side record with the totals the report tools read, summed as graft/records/metrics.py's side_totals does;
    what the other system does not record (decode or prefill time) is None."""
    new_tokens = sum(t["new_tokens"] for t in turns)
    wall = sum(t["wall_s"] for t in turns)
    known = lambda key: None if any(t.get(key) is None for t in turns) else sum(t[key] for t in turns)  # noqa: E731
    totals = {
        "new_tokens": new_tokens,
        "step_tokens": sum(t["step_tokens"] for t in turns),
        "steps": sum(t["steps"] for t in turns),
        "wall_s": wall,
        "decode_s": known("decode_s"),
        "prefill_s": known("prefill_s"),
        "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
    }
    return {"turns": turns, "totals": totals}


def method_summary(records: list[dict], label: str, meta: dict) -> dict:
    """One method's summary: graft/records/metrics.py's throughput on what the records hold; its lossless verdict
    where the records checked one (a peer's outputs against its own AR), else None."""
    from graft.records.metrics import DEFINITIONS, throughput

    method = [r["methods"][label]["side"]["totals"] for r in records]
    base = [r["baseline"]["totals"] for r in records]
    checks = [r["methods"][label]["lossless"] for r in records]
    checked = all(c.get("checked") for c in checks)
    total = lambda rows, key: sum(row[key] for row in rows)  # noqa: E731
    unknown = ("speedup_decode", "avg_nodes_per_step", "avg_kept_nodes_per_step", "retrieval_share", "ms_per_step")
    return {
        **meta,
        "method": label,
        "method_config": {},
        "n_prompts": len(records),
        "n_skipped": 0,
        **throughput(method, base),
        **dict.fromkeys(unknown),
        "baseline_ms_per_step": None,
        "lossless": all(c["equal"] for c in checks) if checked else None,
        "n_divergent": sum(not c["equal"] for c in checks) if checked else None,
        "new_tokens": total(method, "new_tokens"),
        "steps": total(method, "steps"),
        "time_split": None,
        "definitions": DEFINITIONS,
    }


def _intervals(records: list[dict]) -> dict:
    """graft/analysis/stats.py's intervals of the records, unknown decode times as NaN (speedup_decode then has none)."""
    from graft.analysis import stats

    nan = float("nan")
    unknown = lambda side: {**side, "totals": {**side["totals"], "decode_s": nan}}  # noqa: E731
    copies = [
        {
            **r,
            "baseline": unknown(r["baseline"]),
            "methods": {name: {**entry, "side": unknown(entry["side"])} for name, entry in r["methods"].items()},
        }
        for r in records
    ]
    return stats.intervals(copies)


def write_foreign_run(
    out: Path, records: list[dict], *, meta: dict, config: dict, run: dict, suffix: str, partial: bool = False
) -> Path:
    """Write the comparison `records` (each with `baseline` and `methods` {label: entry}) as the run folder `out`,
    whole or not at all (a hidden `.partial` sibling renamed into place). `meta` goes into every summary (model,
    dataset, temperature, hardware and the marker naming where the run came from); `meta["baseline_label"]` is the
    baseline's row in the tables; `suffix` ends every method label and is dropped from summaries/ file names.
    `partial`: the records come from an unfinished run; the summary says so and holds no `complete` record, so
    every tool treats the folder as an unfinished run (shown only with --partial)."""
    from graft.analysis import stats
    from graft.records.folder import marked_partial
    from graft.records.writer import config_hash, records_digest

    labels = list(records[0]["methods"])
    per_method = {label: method_summary(records, label, meta) for label in labels}
    first = per_method[labels[0]]
    keys = ("tau", "speedup_wall", "speedup_decode", "avg_nodes_per_step", "tokens_per_s", "lossless")
    keys += ("retrieval_share", "ms_per_step", "n_prompts")
    base_row = dict.fromkeys(keys)
    base_row.update(tau=first["baseline_tau"], speedup_wall=1.0, tokens_per_s=first["baseline_tokens_per_s"])
    base_row["n_prompts"] = len(records)
    rows = {"ar": base_row, **{label: {k: s.get(k) for k in keys} for label, s in per_method.items()}}
    ids = [r["id"] for r in records]
    marker = {k: meta[k] for k in ("imported", "peer") if k in meta}
    summary = {
        **meta,
        "kind": "comparison",
        "method": "compare",
        "baseline": "ar",
        "n_prompts": len(records),
        "n_skipped": 0,
        "rows": rows,
        "methods": per_method,
        "definitions": first["definitions"],
        "complete": {"plan": marker, "ids": ids, "records_sha1": records_digest(records)},
        "intervals": _intervals(records),
        "interval_method": stats.INTERVAL_METHOD,
    }
    if partial:
        summary = marked_partial(summary)
    run = {"config_hash": config_hash(config), "config": config, **run}
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "summaries").mkdir(parents=True)
    (staging / "samples.jsonl").write_text("".join(json.dumps(r, default=float) + "\n" for r in records))
    (staging / "run.json").write_text(json.dumps(run, indent=2, default=str))
    for label, method_summary_ in per_method.items():
        name = label.removesuffix(suffix)
        (staging / "summaries" / f"{name}.json").write_text(json.dumps(method_summary_, indent=2, default=str))
    (staging / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if out.exists():
        out.rmdir()  # callers refuse a folder that is not empty
    out.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(out)
    return out
