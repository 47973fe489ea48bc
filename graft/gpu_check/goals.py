"""The device check's figures beside the goals docs/gpu.md sets for the GPU path ("Goals"), pass or fail.

Each part writes its figures under `ratios` in its result; `goal_rows` reads them from the report's parts
(JSON only: no torch, so the Markdown renders anywhere). A figure a part did not measure (a skipped part, a
CPU run without an HBM bound) is "n/a", never a pass.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass(frozen=True)
class Goal:
    part: str  # the part whose `ratios` hold the figure
    key: str
    label: str
    goal: str  # as docs/gpu.md states it
    compare: str | None = None  # ">=", "<=", "<" or "==" against `limit`; None: a figure shown without a goal
    limit: float | None = None
    gpu_only: bool = False  # a timing goal set for a GPU: on another device its figure reads "n/a", never pass


GOALS = (
    Goal("4", "ar_over_bound_eager", "AR decode: HBM bound / decode ms, eager (8B-shaped)", "(no goal eager)"),
    Goal(
        "7",
        "ar_over_bound_compiled",
        "AR decode: HBM bound / decode ms, compiled (8B-shaped slice)",
        ">= 0.60",
        ">=",
        0.60,
        gpu_only=True,
    ),
    Goal("4", "verify60_over_decode_1k", "verify(60) / decode at 1K context", "<= 1.3", "<=", 1.3, gpu_only=True),
    Goal("4", "verify60_over_decode_8k", "verify(60) / decode at 8K context", "<= 1.3", "<=", 1.3, gpu_only=True),
    Goal(
        "4",
        "eagle3_step_over_decode",
        "EAGLE-3 whole step / AR step (events clock)",
        "<= 1.39",
        "<=",
        1.39,
        gpu_only=True,
    ),
    Goal(
        "4",
        "dflash_step_over_decode",
        "DFlash whole step / AR step (events clock, random block drafter)",
        "<= 1.34",
        "<=",
        1.34,
        gpu_only=True,
    ),
    Goal("4", "graft_step_over_decode", "Graft whole step / AR step (7 levels, fixed-size tree)", "(no goal)"),
    Goal(
        "4",
        "prune_verify16_over_verify60",
        "pruning: verify(16) / verify(60) at 1K context (kept nodes in buckets of 8)",
        "< 1",
        "<",
        1,
        gpu_only=True,
    ),
    Goal(
        "4",
        "prune_verify_step_max",
        "pruning: worst verify(smaller) / verify(next larger) over kept nodes 60, 32, 16, 8",
        "<= 1.05 (non-increasing, 5 % noise)",
        "<=",
        1.05,
        gpu_only=True,
    ),
    Goal("4", "eagle3_t1_over_greedy", "EAGLE-3 step at temperature 1 / greedy step", "(no goal)"),
    Goal("4", "graft_t1_over_greedy", "Graft step at temperature 1 / greedy step", "(no goal)"),
    Goal("4", "dflash_t1_over_greedy", "DFlash step at temperature 1 / greedy step", "(no goal)"),
    Goal("3", "syncs_per_step_max", "host syncs per step, greedy, dispatcher counter (worst step)", "(1 or 2)"),
    Goal(
        "3",
        "excess_syncs_max",
        "host syncs per step beyond the allowed reads, greedy (dispatcher counter, worst step)",
        "<= 0",
        "<=",
        0,
    ),
    Goal(
        "3",
        "excess_syncs_sampled_max",
        "host syncs per step beyond the allowed reads, temperature 1 (dispatcher counter, worst step)",
        "<= 0",
        "<=",
        0,
    ),
    Goal(
        "3",
        "debug_mode_excess_max",
        "host syncs per step beyond the allowed reads under set_sync_debug_mode (worst method)",
        "<= 0",
        "<=",
        0,
    ),
    Goal("7", "graphs_timed", "graphs compiled in timed runs", "0", "<=", 0, gpu_only=True),
    Goal("7", "rerecords_timed", "CUDA-graph recordings in timed runs", "0", "<=", 0, gpu_only=True),
    Goal("5", "verify60_over_decode", "MoE (235B-shaped, 4 layers): verify(60) / decode", "(no goal; bound in column)"),
    Goal(
        "9",
        "batch_syncs_per_step_max",
        "B = 8, greedy: host syncs per batched step, dispatcher counter (worst step of ar / eagle3 / graft)",
        "<= 1",
        "<=",
        1,
    ),
    Goal(
        "9",
        "batch_debug_syncs_per_step_max",
        "B = 8, greedy: host syncs per batched step under set_sync_debug_mode (worst step)",
        "<= 1",
        "<=",
        1,
        gpu_only=True,
    ),
    Goal(
        "9",
        "batch_leave_join_excess_max",
        "B = 8: host syncs of a round sequences leave or join in, beyond its stated reads (1, + 1 for the leavers'"
        " records, + 1 per newcomer's first token; worst round)",
        "<= 0",
        "<=",
        0,
    ),
    Goal(
        "9",
        "batch_lossless",
        "B = 8, greedy: every sequence's tokens = batch-1 AR's (float ties allowed)",
        "yes",
        "==",
        1,
    ),
    Goal("9", "batch_ar_over_ar1", "B = 8 ar: tokens/s / batch-1 AR's (same prompts)", "(no goal)"),
    Goal("9", "batch_eagle3_over_ar1", "B = 8 eagle3: tokens/s / batch-1 AR's (same prompts)", "(no goal)"),
    Goal("9", "batch_graft_over_ar1", "B = 8 graft: tokens/s / batch-1 AR's (same prompts)", "(no goal)"),
    Goal("2", "lossless", "lossless, greedy: every method's tokens = AR's (float ties allowed)", "yes", "==", 1),
    Goal("8", "lossless", "lossless, sampled: every method's chi-square p > 0.001", "yes", "==", 1),
)

COMPARE = {">=": operator.ge, "<=": operator.le, "<": operator.lt, "==": operator.eq}


def verdict(goal: Goal, value, device: str = "cuda") -> str:
    if value is None:
        return "n/a"
    if goal.gpu_only and not device.startswith("cuda"):
        return "n/a (GPU goal)"
    if goal.compare is None:
        return "-"
    return "pass" if COMPARE[goal.compare](float(value), goal.limit) else "FAIL"


def goal_rows(parts: dict, device: str = "cuda") -> list[dict]:
    """[{figure, value, goal, result, note}] for every goal, from the parts' `ratios` measured on `device`."""
    rows = []
    for goal in GOALS:
        ratios = parts.get(goal.part, {}).get("result", {}).get("ratios", {})
        value = ratios.get(goal.key)
        if isinstance(value, bool):
            value = int(value)
        rows.append(
            {
                "figure": goal.label,
                "value": value,
                "goal": goal.goal,
                "result": verdict(goal, value, device),
                "note": ratios.get(f"{goal.key}_note"),
                "part": goal.part,
            }
        )
    return rows


def failed(rows: list[dict]) -> list[str]:
    """The figures whose goal failed (the device check then exits 1)."""
    return [row["figure"] for row in rows if row["result"] == "FAIL"]


def goals_text(rows: list[dict]) -> str:
    """The rows as aligned text, for the console."""
    width, goal_width = max(len(r["figure"]) for r in rows), max(len(r["goal"]) for r in rows)
    lines = [f"{'figure':<{width}}  {'value':>9}  {'goal':<{goal_width}}  result"]
    for r in rows:
        value = "-" if r["value"] is None else f"{r['value']:.3g}" if isinstance(r["value"], float) else str(r["value"])
        lines.append(f"{r['figure']:<{width}}  {value:>9}  {r['goal']:<{goal_width}}  {r['result']}")
    return "\n".join(lines)
