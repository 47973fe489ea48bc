"""Run-level metrics from per-prompt records. The definitions are printed next to the numbers.

- tau: tokens committed by verification steps / steps (bonus token included; the prefill's first token
  excluded), summed over every turn of every prompt. Autoregressive decoding has exactly 1.00.
- tokens_per_s: mean over prompts of (new tokens / wall time), prefill included, as in Spec-Bench.
- speedup_wall: tokens_per_s of the method / the same for the baseline run on the same prompts.
- speedup_decode: baseline seconds per step token after prefill / the method's (prefill excluded).
- lossless: greedy only: every prompt's tokens equal the baseline's (null under sampling).
- avg_nodes_per_step: tree slots verified per step, root included; with fixed-size trees (hardware.fixed_size_trees)
  a step may verify empty slots, and avg_kept_nodes_per_step counts only the slots that hold a token.
- retrieval_share: accepted nodes that retrieval proposed / all accepted nodes (bonus tokens excluded).
- loop_overhead: share of step time outside the target forward and the drafter (mask, acceptance,
  cache commit, bookkeeping).
With run.repeats = R > 1 every figure is over all R passes (a prompt's R records); n_prompts counts prompts.
"""

from __future__ import annotations

import statistics

DEFINITIONS = {
    "tau": "step tokens / steps (accepted + bonus per verification; AR = 1.00)",
    "tokens_per_s": "mean over prompts of new tokens / wall s (prefill included)",
    "baseline_tokens_per_s": "the same for the baseline, same prompts, interleaved",
    "speedup_wall": "tokens_per_s / baseline_tokens_per_s",
    "speedup_wall_median": "median over prompts of the per-prompt tokens/s ratio",
    "speedup_decode": "baseline s per step token / method s per step token (prefill excluded)",
    "lossless": "greedy: every prompt's tokens equal the baseline's",
    "avg_nodes_per_step": "verified tree slots per step, root included (fixed-size trees: empty slots too)",
    "avg_kept_nodes_per_step": "verified slots per step that hold a token, root included",
    "retrieval_share": "accepted retrieved nodes / all accepted nodes (bonus tokens excluded)",
    "retrieved_nodes_per_step": "verified nodes per step that retrieval proposed",
    "graft_overhead": "share of step time in table update, template readout, grafting (drafter-timed)",
    "stages": "share of steps per pruner stage (check@<levels> fired, or dense)",
    "loop_overhead": "share of step time not in the target forward or the drafter",
    "baseline_tau": "tau of the baseline run (1.00 by construction)",
    "ms_per_step": "draft + verify + other milliseconds per step",
    "baseline_ms_per_step": "the same for the baseline",
    "baseline_loop_overhead": "loop_overhead of the baseline run",
    "mean_prompt_tokens": "prompt tokens per turn (chat template included)",
    "mean_prefill_s": "seconds per turn to encode the prompt and produce the first token",
    "prefill_tokens_per_s": "prompt tokens / prefill seconds",
}


SOURCE_KEYS = ("draft_nodes", "retrieved_nodes", "accepted_draft", "accepted_retrieved")


def record_sides(record: dict, method: str | None = None, baseline: str | None = "ar") -> dict[str, dict]:
    """{method name: side} of one finished prompt record: a comparison's `methods`, or a single run's `method`
    under the name `method` (default: the record's `_method`), after the shared baseline under the name
    `baseline` (None: left out); {} for a record that did not finish."""
    if record.get("status") != "ok":
        return {}
    sides = {baseline: record["baseline"]} if baseline and record.get("baseline") else {}
    if "methods" in record:
        sides.update({name: entry["side"] for name, entry in record["methods"].items()})
    else:
        sides[method if method is not None else record.get("_method", "method")] = record["method"]
    return sides


def side_totals(turns: list[dict]) -> dict:
    new_tokens = sum(t["new_tokens"] for t in turns)
    wall = sum(t["wall_s"] for t in turns)
    return {
        "new_tokens": new_tokens,
        "step_tokens": sum(t["step_tokens"] for t in turns),
        "steps": sum(t["steps"] for t in turns),
        "nodes": sum(sum(t["nodes"]) for t in turns),
        "kept_nodes": sum(sum(t.get("kept_nodes", t["nodes"])) for t in turns),  # older records: no empty slots
        "wall_s": wall,
        "decode_s": sum(t["decode_s"] for t in turns),
        "prefill_s": sum(t["prefill_s"] for t in turns),
        "draft_s": sum(sum(t["draft_ms"]) for t in turns) / 1e3,
        "verify_s": sum(sum(t["verify_ms"]) for t in turns) / 1e3,
        "other_s": sum(sum(t["other_ms"]) for t in turns) / 1e3,
        "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
        **{key: sum(row[i] for t in turns for row in t.get("step_sources", [])) for i, key in enumerate(SOURCE_KEYS)},
    }


def _mean(values) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def throughput(method: list[dict], base: list[dict]) -> dict:
    """The ratios every summary has, from the per-prompt totals of a method and of its baseline: tau, tokens per
    second (mean over prompts) and the wall speedup (ratio of the means, and the median of per-prompt ratios)."""
    total = lambda rows, key: sum(row.get(key, 0) for row in rows)  # noqa: E731
    tps = statistics.fmean(row["tokens_per_s"] for row in method) if method else 0.0
    base_tps = statistics.fmean(row["tokens_per_s"] for row in base) if base else 0.0
    per_prompt = [m["tokens_per_s"] / b["tokens_per_s"] for m, b in zip(method, base) if b["tokens_per_s"]]
    return {
        "tau": _ratio(total(method, "step_tokens"), total(method, "steps")),
        "baseline_tau": _ratio(total(base, "step_tokens"), total(base, "steps")),
        "tokens_per_s": tps,
        "baseline_tokens_per_s": base_tps,
        "speedup_wall": _ratio(tps, base_tps),
        "speedup_wall_median": statistics.median(per_prompt) if per_prompt else None,
    }


def summarize(records: list[dict], meta: dict) -> dict:
    done = [r for r in records if r.get("status") == "ok"]
    method = [r["method"]["totals"] for r in done]
    base = [(r["baseline"] or r["method"])["totals"] for r in done]
    total = lambda rows, key: sum(row.get(key, 0) for row in rows)  # noqa: E731
    step_time = total(method, "draft_s") + total(method, "verify_s") + total(method, "other_s")
    checked = [r["lossless"] for r in done if r["lossless"]["checked"]]
    divergent = [c for c in checked if not c["equal"]]
    summary = {
        **meta,
        # a later repeat of a prompt (run.repeats; its record has `repeat`) is the same prompt again
        "n_prompts": sum(1 for r in done if not r.get("repeat")),
        "n_skipped": sum(1 for r in records if r.get("status") == "skipped" and not r.get("repeat")),
        **throughput(method, base),
        "speedup_decode": _ratio(
            _ratio(total(base, "decode_s"), total(base, "step_tokens")) or 0.0,
            _ratio(total(method, "decode_s"), total(method, "step_tokens")) or 0.0,
        ),
        "lossless": (len(divergent) == 0) if checked else None,
        "n_divergent": len(divergent),
        "n_divergent_float_tie": sum(1 for c in divergent if c["first_divergence"]["float_tie"]),
        "avg_nodes_per_step": _ratio(total(method, "nodes"), total(method, "steps")),
        "avg_kept_nodes_per_step": _ratio(total(method, "kept_nodes"), total(method, "steps")),
        "retrieval_share": _ratio(
            total(method, "accepted_retrieved"), total(method, "accepted_draft") + total(method, "accepted_retrieved")
        ),
        "retrieved_nodes_per_step": _ratio(total(method, "retrieved_nodes"), total(method, "steps")),
        "new_tokens": total(method, "new_tokens"),
        "steps": total(method, "steps"),
        "time_split": {
            "draft": _ratio(total(method, "draft_s"), step_time),
            "verify": _ratio(total(method, "verify_s"), step_time),
            "other": _ratio(total(method, "other_s"), step_time),
        },
        "loop_overhead": _ratio(total(method, "other_s"), step_time),
        "baseline_loop_overhead": _ratio(
            total(base, "other_s"), total(base, "draft_s") + total(base, "verify_s") + total(base, "other_s")
        ),
        "ms_per_step": _ratio(1e3 * step_time, total(method, "steps")),
        "baseline_ms_per_step": _ratio(
            1e3 * (total(base, "draft_s") + total(base, "verify_s") + total(base, "other_s")), total(base, "steps")
        ),
        "mean_prompt_tokens": _mean(t["prompt_tokens"] for r in done for t in r["method"]["turns"]),
        "mean_prefill_s": _mean(t["prefill_s"] for r in done for t in r["method"]["turns"]),
        "prefill_tokens_per_s": _ratio(
            sum(t["prompt_tokens"] for r in done for t in r["method"]["turns"]),
            sum(t["prefill_s"] for r in done for t in r["method"]["turns"]),
        ),
        "definitions": DEFINITIONS,
    }
    infos = [i for r in done for t in r["method"]["turns"] for i in t.get("step_info") or []]
    stages = [i["stage"] for i in infos if "stage" in i]
    if stages:
        summary["stages"] = {stage: stages.count(stage) / len(stages) for stage in sorted(set(stages))}
    # retrieval_ms; records written before the rename call it graft_ms
    retrieval_ms = [i.get("retrieval_ms", i.get("graft_ms")) for i in infos if "retrieval_ms" in i or "graft_ms" in i]
    if retrieval_ms:
        summary["graft_overhead"] = _ratio(sum(retrieval_ms) / 1e3, step_time)
    scored = [r["score"] for r in done if r.get("score") and r["score"].get("method") and not r.get("repeat")]
    if scored:
        metric = scored[0]["method"]["metric"]
        side = lambda role: statistics.fmean(float((s.get(role) or s["method"])["correct"]) for s in scored)  # noqa: E731
        summary["score"] = {
            "metric": metric,
            "n_scored": len(scored),
            "method": side("method"),
            "baseline": side("baseline"),
        }
    return summary


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def batch_summary(records: list[dict], batch_size: int) -> dict:
    """What a batched run (run.batch_size > 1) measured, per role (the baseline, each method), from the groups
    its records name (each group's totals counted once): throughput over the whole batch (new tokens per wall
    second, prefill included; and with the prefill seconds taken out), nodes verified per batched step summed
    over its sequences, sequences per step, each sequence's tokens/s at p50 and p90, and each method's
    throughput over the baseline's (speedup_throughput: batched AR at the same batch size, same prompts)."""
    groups: dict[str, dict] = {}
    latency: dict[str, list[float]] = {}
    members: dict[str, int] = {}
    for record in records:
        if "batch" in record:
            members[record["batch"]["group"]] = members.get(record["batch"]["group"], 0) + 1
    for record in records:
        if record.get("status") != "ok" or "batch" not in record:
            continue
        name = record["batch"]["group"]
        if members[name] != _group_size(name):  # a group cut by a kill: its totals count prompts measured again
            continue
        totals = groups[name] = record["batch"]["totals"]
        single = next((role for role in totals if role != "baseline"), None)  # a single-method run's method
        for role, side in record_sides(record, method=single, baseline="baseline").items():
            if side["totals"].get("tokens_per_s") is not None:
                latency.setdefault(role, []).append(side["totals"]["tokens_per_s"])
    roles: dict[str, dict] = {}
    for totals in groups.values():
        for role, t in totals.items():
            into = roles.setdefault(role, dict.fromkeys(BATCH_TOTALS, 0))
            for key in into:
                into[key] += t.get(key, 0)  # (runs before `positions` and the steady counts: 0)
    out = {}
    for role, t in roles.items():
        decode_s = t["wall_s"] - t["prefill_s"]
        out[role] = {
            "throughput_tokens_per_s": _ratio(t["tokens"], t["wall_s"]),
            "throughput_decode_tokens_per_s": _ratio(t["tokens"], decode_s) if decode_s > 0 else None,
            "nodes_per_step": _ratio(t["nodes"], t["steps"]),
            "sequences_per_step": _ratio(t["sequences"], t["steps"]),
            # outside the ramp-up and the drain (graft/batch.py: occupancy), where methods are compared
            "steady_sequences_per_step": _ratio(t["steady_sequences"], t["steady_steps"]),
            "positions_per_node": _ratio(t["positions"], t["nodes"]),  # 1.0: no padding computed
            "prefill_share": _ratio(t["prefill_s"], t["wall_s"]),
            "latency_tokens_per_s_p50": _percentile(latency.get(role, []), 0.5),
            "latency_tokens_per_s_p90": _percentile(latency.get(role, []), 0.9),
            **t,
        }
    base = out.get("baseline", {}).get("throughput_tokens_per_s")
    for role, row in out.items():
        row["speedup_throughput"] = (
            _ratio(row["throughput_tokens_per_s"], base) if base and role != "baseline" else None
        )
    cut = sorted(name for name, count in members.items() if count != _group_size(name))
    return {"batch_size": batch_size, "groups": len(groups), "groups_cut": cut, "roles": out}


# what a batched group's totals sum per role (graft/run/batched.py: run_conversations)
BATCH_TOTALS = (
    "tokens", "wall_s", "prefill_s", "steps", "nodes", "positions", "sequences", "steady_steps", "steady_sequences",
)  # fmt: skip


def _group_size(name: str) -> int:
    """The records a batched group holds: its name is "<first record id>+<count>"."""
    return int(name.rsplit("+", 1)[1])
