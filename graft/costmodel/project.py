"""Projected speedups from recorded acceptance and a device's cost profile, next to the measured ones.

    python -m graft.costmodel project RUN_DIR... --profile results/cost_model/cost_profile_cpu.json [--out table.md]
    python -m graft.costmodel project multirun/pareto/smollm2_135m --profile P.json --budgets

For every run directory (a comparison's methods, or a single-method run) and method, the projected speedup
(graft/costmodel: the recorded steps' accepted tokens, node counts and contexts timed by the profile)
beside the run's measured `speedup_decode` (baseline s per step token / the method's, prefill excluded:
the quantity the model projects). `--budgets` lays a budget sweep out as rows = (budget, thresholds),
columns = methods. `--draft profile` takes the drafters' step cost from the profile instead of the run's
measured draft ms: for projecting onto another device than the one that recorded the runs.

A profile measured at batch B (`python -m graft.costmodel profile --batch B`) projects the runs to batch B: a
step of N nodes costs a sequence its draft + verify_B(N) / B + overhead(N), the baseline's step (batched AR at
B) ar draft + verify_B(1) / B + overhead(1), and the speedup is their ratio per token: the projection of
`batch.speedup_throughput` at B, prefill excluded. A run recorded at B is compared with its own measured
decode throughput over batched AR's; a run recorded at another batch (batch 1) has nothing measured at B.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from graft.budget.profile import AR, CostProfile
from graft.records.reader import run_dirs
from graft.schema import ConfigError

WITHIN = 0.10  # "agrees" = projected within 10% of measured


@dataclass(frozen=True)
class Step:
    """One verification step of a record: what the cost model needs."""

    accepted: int  # tokens committed (accepted nodes + bonus)
    nodes: int  # tree nodes verified, root included
    context: int  # committed cache positions the tree was verified on
    draft_ms: float  # the drafter's measured ms (propose + update) on the recording device
    # as recorded, to compare the profile with (`recorded_split`); the projection does not read them
    verify_ms: float | None = None
    other_ms: float | None = None
    experts: float | None = None  # distinct experts per MoE layer the step's tree touched, where recorded


def turn_steps(turn: Mapping) -> list[Step]:
    """A turn record's steps, each with its context rebuilt: the prompt, then every token committed by the
    earlier steps (the first new token comes from the prefill and is the first step's root, not cached)."""
    context = turn["prompt_tokens"]
    steps = []
    recorded = zip(turn["accept_lengths"], turn["nodes"], turn["draft_ms"], turn["verify_ms"], turn["other_ms"])
    experts = turn.get("experts_touched") or [None] * len(turn["accept_lengths"])
    for (accepted, nodes, draft, verify, other), touched in zip(recorded, experts):
        steps.append(Step(accepted, nodes, context, draft, verify, other, touched))
        context += accepted
    return steps


def run_steps(run: Path) -> dict[str, list[Step]]:
    """{method: every step of every prompt} of one run directory, the baseline as `ar`."""
    from graft.records.reader import run_sides

    steps: dict[str, list[Step]] = {}
    for _, _, method, side in run_sides(Path(run)):
        for turn in side["turns"]:
            steps.setdefault(method, []).extend(turn_steps(turn))
    return steps


def recorded_split(steps: Sequence[Step], profile: CostProfile | None = None) -> dict:
    """Mean recorded ms per step (draft, verify, other) and per committed token, and with a profile the
    profile's verify and overhead for the same steps: where a projection departs from a run."""
    n, tokens = len(steps), sum(s.accepted for s in steps)
    split = {
        "draft_ms_per_step": sum(s.draft_ms for s in steps) / n,
        "verify_ms_per_step": sum(s.verify_ms for s in steps) / n,
        "other_ms_per_step": sum(s.other_ms for s in steps) / n,
        "ms_per_token": sum(s.draft_ms + s.verify_ms + s.other_ms for s in steps) / tokens,
    }
    if profile is not None:  # at a profile's batch B, a sequence's share of the forward (as the projection counts)
        split["profile_verify_ms_per_step"] = sum(profile.verify_share_ms(s.nodes, s.context) for s in steps) / n
        split["profile_overhead_ms_per_step"] = sum(profile.overhead_ms(s.nodes, s.accepted) for s in steps) / n
    return split


def ar_ms_per_token(steps: Iterable[Step], profile: CostProfile, draft_ms: float) -> float:
    """The baseline's ms per token over the same tokens: a step that committed `a` tokens at context c stands
    for `a` one-node steps at contexts c .. c + a - 1 (at a profile's batch B, its share of B one-node rows)."""
    total, tokens = 0.0, 0
    for step in steps:
        for offset in range(step.accepted):
            total += draft_ms + profile.verify_share_ms(1, step.context + offset) + profile.overhead_ms(1)
        tokens += step.accepted
    return total / tokens


def job_anchor(ar_steps: Sequence[Step], profile: CostProfile) -> float:
    """How much slower than the profile the job's own baseline ran: its recorded forward + loop ms per AR step
    over the profile's for the same steps. Scaling the profile by it keeps the profile's shape (how cost
    grows with nodes and context) and takes the machine's speed of that job from its baseline, which the
    projected method never reads (a VM's speed drifts by tens of percent over minutes)."""
    timed = [s for s in ar_steps if s.verify_ms is not None and s.other_ms is not None]
    recorded = sum(s.verify_ms + s.other_ms for s in timed)
    profiled = sum(profile.verify_ms(1, s.context) + profile.overhead_ms(1) for s in timed)
    if not recorded or not profiled:
        raise ValueError("the job's baseline has no recorded verify times to anchor the profile on")
    return recorded / profiled


def project(
    steps: Sequence[Step | Mapping],
    profile: CostProfile,
    draft_ms: float | None = None,
    ar_draft_ms: float | None = None,
) -> dict:
    """The projected time per committed token of one method's steps and its projected speedup over AR.

    draft_ms: None uses each step's measured draft ms (right when the profile was measured on the device
    that recorded the run); a number replaces it (a profile's draft cost, to project onto another device).
    ar_draft_ms: the baseline's draft ms per step (a root-only tree); default the profile's `ar` entry, or 0.
    At a profile's batch B each step is one sequence's share of a batched step: its draft, verify_B(N) / B and
    overhead(N); the baseline is batched AR at B.
    """
    needed = ("accepted", "nodes", "context", "draft_ms")
    steps = [s if isinstance(s, Step) else Step(**{k: s[k] for k in needed}, experts=s.get("experts")) for s in steps]
    if not steps:
        raise ValueError("no steps to project")
    if ar_draft_ms is None:
        ar_draft_ms = profile.draft_step_ms.get(AR, 0.0)
    drafts = [s.draft_ms if draft_ms is None else draft_ms for s in steps]
    verifies = [profile.verify_share_ms(s.nodes, s.context, s.experts) for s in steps]
    overheads = [profile.overhead_ms(s.nodes, s.accepted) for s in steps]
    tokens = sum(s.accepted for s in steps)
    step_ms = (sum(drafts) + sum(verifies) + sum(overheads)) / len(steps)
    ms_per_token = step_ms * len(steps) / tokens  # = mean(step time) / mean(accepted)
    baseline = ar_ms_per_token(steps, profile, ar_draft_ms)
    return {
        "kind": "projection",
        "device": profile.device,
        "batch": profile.batch,
        "steps": len(steps),
        "tokens": tokens,
        "tau": tokens / len(steps),
        "avg_nodes_per_step": sum(s.nodes for s in steps) / len(steps),
        "draft": "measured" if draft_ms is None else "profile",
        "draft_ms_per_step": sum(drafts) / len(steps),
        "verify_ms_per_step": sum(verifies) / len(steps),
        "overhead_ms_per_step": sum(overheads) / len(steps),
        "ms_per_step": step_ms,
        "ms_per_token": ms_per_token,
        "baseline_ms_per_token": baseline,
        "speedup": baseline / ms_per_token,
    }


def method_summaries(summary: dict) -> dict[str, dict]:
    """{method: its summary} of a comparison or of a single-method run."""
    if summary.get("kind") == "comparison":
        return summary["methods"]
    return {summary["method"]: summary}


def _label(thresholds) -> str:
    return "/".join(f"{t:g}" for t in thresholds) if thresholds else "-"


def job_thresholds(summary: dict) -> str:
    """The thresholds a sweep job ran with (any of its methods' that has them), so that a method without
    thresholds (EAGLE-3) can be placed in its job's row."""
    for method_summary in method_summaries(summary).values():
        thresholds = (method_summary.get("method_config") or {}).get("thresholds")
        if thresholds:
            return _label(thresholds)
    return "-"


def run_batch(summary: dict) -> int:
    """The run.batch_size a run decoded at (summary.json's `batch`, written at B > 1)."""
    return (summary.get("batch") or {}).get("batch_size", 1)


def measured_speedup(summary: dict, method_summary: dict, method: str, batch: int) -> float | None:
    """What a projection at `batch` compares with: at batch 1 the run's speedup_decode; at the run's own batch
    B > 1 its decode throughput over batched AR's (batch.speedup_throughput with the prefill seconds out); a
    run recorded at another batch measured nothing at this one (None)."""
    if run_batch(summary) != batch:
        return None
    if batch == 1:
        return method_summary.get("speedup_decode")
    roles = summary["batch"]["roles"]
    mine, base = (roles.get(role, {}).get("throughput_decode_tokens_per_s") for role in (method, "baseline"))
    return mine / base if mine and base else None


def projection_rows(
    paths, profile: CostProfile, methods: list[str] | None, draft: str, anchor: str = "profile", partial: bool = False
) -> list[dict]:
    """One row per (run, method): the setting, the measured speedup (`measured_speedup`) and the projection.
    anchor="job" scales the profile per run by its own baseline's speed (graft/costmodel: job_anchor)."""
    if anchor == "job" and profile.batch > 1:
        raise ConfigError(
            f"--anchor job scales a profile by a run's own batch-1 baseline; this profile was measured at batch "
            f"{profile.batch}: use --anchor profile"
        )
    rows = []
    for run in run_dirs(paths, partial):  # unfinished runs too with --partial, as run_dirs tells the user
        summary = json.loads((run / "summary.json").read_text())
        steps = run_steps(run)
        factor = job_anchor(steps[AR], profile) if anchor == "job" and steps.get(AR) else None
        used = profile.scaled(factor) if factor else profile
        for method, method_summary in method_summaries(summary).items():
            if method == AR or (methods and method not in methods) or not steps.get(method):
                continue
            config = method_summary.get("method_config") or {}
            draft_ms = profile.draft_ms(method) if draft == "profile" else None
            projection = project(steps[method], used, draft_ms=draft_ms)
            measured = measured_speedup(summary, method_summary, method, profile.batch)
            rows.append(
                {
                    "run": str(run),
                    "run_batch": run_batch(summary),
                    "model": summary.get("model"),
                    "dataset": summary.get("dataset"),
                    "method": method,
                    "budget": config.get("total_tokens"),
                    "thresholds": _label(config.get("thresholds")),
                    "job_thresholds": job_thresholds(summary),
                    "tau": projection["tau"],
                    "nodes": projection["avg_nodes_per_step"],
                    "measured": measured,
                    "projected": projection["speedup"],
                    "error": projection["speedup"] / measured - 1 if measured else None,
                    "projection": projection,
                    "anchor_factor": factor,
                    "recorded": recorded_split(steps[method], used),
                    "baseline_recorded": recorded_split(steps[AR], used) if steps.get(AR) else None,
                }
            )
    return rows


def header(profile_path: Path, profile: CostProfile, draft: str, anchor: str = "profile") -> str:
    measured_at = profile.meta.get("measured_at", "date not recorded")
    drafts = "the profile's draft costs" if draft == "profile" else "each run's measured draft ms"
    anchored = (
        " scaled per run by its own baseline's speed (recorded AR forward + loop ms per step over the profile's)"
        if anchor == "job"
        else ""
    )
    if profile.batch > 1:
        return (
            f"Every projected number is a projection at batch {profile.batch} from {profile_path} measured on "
            f"{profile.device} ({profile.model}, {measured_at}), with {drafts}: a sequence's step is its draft + "
            f"verify of {profile.batch} trees / {profile.batch} + overhead, over batched AR at {profile.batch}; "
            f"measured = a run recorded at batch {profile.batch}: its decode throughput over batched AR's "
            "(batch.speedup_throughput, prefill excluded); runs recorded at another batch have none (-)."
        )
    return (
        f"Every projected number is a projection from {profile_path} measured on {profile.device} "
        f"({profile.model}, {measured_at}){anchored}, with {drafts}; measured = the run's speedup_decode "
        "(baseline s per step token / the method's, prefill excluded)."
    )


def markdown(columns: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def run_table(rows: list[dict], batch: int = 1) -> str:
    projected = f"projected at batch {batch}" if batch > 1 else "projected"
    columns = ["dataset", "method", "budget", "tau", "nodes/step", "measured", projected, "projected/measured - 1"]
    lines = [
        [
            str(r["dataset"]),
            r["method"],
            "-" if r["budget"] is None else str(r["budget"]),
            f"{r['tau']:.2f}",
            f"{r['nodes']:.1f}",
            _x(r["measured"]),
            _x(r["projected"]),
            _pct(r["error"]),
        ]
        for r in rows
    ]
    return markdown(columns, lines)


def budget_table(rows: list[dict]) -> str:
    """A sweep: rows = (budget, the job's thresholds), columns = methods, cells "projected (measured)". A
    method without thresholds (EAGLE-3) sits in the row of the job it ran in."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cells: dict[tuple, dict[str, list[str]]] = {}
    for r in rows:
        setting = (r["budget"] or 0, r["job_thresholds"])
        cells.setdefault(setting, {}).setdefault(r["method"], []).append(f"{_x(r['projected'])} ({_x(r['measured'])})")
    lines = [
        [str(budget), thresholds, *("; ".join(cells[(budget, thresholds)].get(m, ["-"])) for m in methods)]
        for budget, thresholds in sorted(cells)
    ]
    return markdown(["budget", "thresholds", *(f"{m}: projected (measured)" for m in methods)], lines)


def diagnosis_table(rows: list[dict]) -> str:
    """Where each projection departs from its run: the recorded ms per step beside the profile's for the same
    steps (method and baseline; "drift" = recorded / profile - 1: a run slowed by other load shows here),
    and the speedup replayed from the recorded step times (the model's arithmetic on the run's own costs:
    it differs from the measured speedup_decode only by time outside the steps)."""
    columns = ["dataset", "method", "budget", "thresholds", "verify rec -> profile (drift)"]
    columns += ["AR verify rec -> profile (drift)", "other rec -> profile", "AR other rec -> profile", "draft rec"]
    columns += ["replayed", "measured", "projected"]

    def versus(split: dict | None, recorded: str, profiled: str, drift: bool = False) -> str:
        if split is None:
            return "-"
        text = f"{split[recorded]:.2f} -> {split[profiled]:.2f}"
        return text + f" ({_pct(split[recorded] / split[profiled] - 1)})" if drift else text

    lines = []
    for r in rows:
        m, b = r["recorded"], r["baseline_recorded"]
        lines.append(
            [
                str(r["dataset"]),
                r["method"],
                "-" if r["budget"] is None else str(r["budget"]),
                r["job_thresholds"],
                versus(m, "verify_ms_per_step", "profile_verify_ms_per_step", drift=True),
                versus(b, "verify_ms_per_step", "profile_verify_ms_per_step", drift=True),
                versus(m, "other_ms_per_step", "profile_overhead_ms_per_step"),
                versus(b, "other_ms_per_step", "profile_overhead_ms_per_step"),
                f"{m['draft_ms_per_step']:.2f}",
                _x(b["ms_per_token"] / m["ms_per_token"] if b else None),
                _x(r["measured"]),
                _x(r["projected"]),
            ]
        )
    return markdown(columns, lines)


def agreement(rows: list[dict], batch: int = 1) -> str:
    checked = [r for r in rows if r["error"] is not None]
    if batch > 1 and not checked:
        return f"No run here was measured at batch {batch}: nothing to compare the projections with."
    close = sum(abs(r["error"]) <= WITHIN for r in checked)
    return f"{close} of {len(checked)} projections within {WITHIN:.0%} of the measured speedup_decode."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m graft.costmodel project",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", help="run directories, or folders holding them")
    parser.add_argument(
        "--profile", type=Path, required=True, help="a CostProfile JSON (python -m graft.costmodel profile)"
    )
    parser.add_argument("--methods", help="comma-separated methods to project (default: all but ar)")
    parser.add_argument("--draft", choices=["measured", "profile"], default="measured")
    parser.add_argument("--budgets", action="store_true", help="a budget sweep: rows = (budget, thresholds)")
    parser.add_argument(
        "--anchor",
        choices=["profile", "job"],
        default="profile",
        help="job: scale the profile per run by the speed its own baseline ran at (the profile keeps its shape)",
    )
    parser.add_argument("--diagnose", action="store_true", help="also the recorded ms per step beside the profile's")
    parser.add_argument("--partial", action="store_true", help="also unfinished (killed) runs' recorded steps")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--json", type=Path, help="also write every row with its full projection here")
    args = parser.parse_args(argv)

    profile = CostProfile.load(args.profile)
    methods = args.methods.split(",") if args.methods else None
    try:
        rows = projection_rows(args.paths, profile, methods, args.draft, args.anchor, args.partial)
    except KeyError as err:  # --draft profile, and the profile did not measure a method's drafter
        if not str(err.args[0]).startswith("the profile has no draft cost"):  # a record without a field it reads
            raise ConfigError(
                f"a run under {' '.join(args.paths)} records no {err.args[0]!r} per turn, which a projection reads "
                "(a record of an older harness?)"
            ) from None
        raise ConfigError(
            f"{args.profile}: {err.args[0]}; measure it with python -m graft.costmodel profile --methods, "
            "or use --draft measured"
        ) from None
    if not rows:
        raise ConfigError(f"no run with recorded steps under {' '.join(args.paths)}")
    table = budget_table(rows) if args.budgets else run_table(rows, profile.batch)
    parts = [header(args.profile, profile, args.draft, args.anchor), table, agreement(rows, profile.batch)]
    if args.diagnose:
        parts += ["Recorded ms per step (rec) beside the profile's for the same steps:", diagnosis_table(rows)]
    others = sorted({r["model"] for r in rows} - {profile.model})
    if others:  # acceptance comes from one target, costs from another: say so beside the numbers
        parts.append(f"Note: the profile times {profile.model}; the runs recorded {', '.join(others)}.")
    text = "\n\n".join(parts) + "\n"
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
