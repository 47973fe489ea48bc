"""A cost model of speculative decoding: what a method's speedup would be, from its acceptance records and a
device's measured costs.

Each step a drafter proposes a tree of N nodes (root included), the target verifies all N in one forward,
and the step commits `accepted` tokens (accepted nodes + the bonus token). The autoregressive baseline
verifies 1 node and commits 1 token per step. So

    ms per committed token = sum over steps (draft + verify(N, context) + overhead(N)) / sum(accepted)
    AR ms per committed token = mean over the same tokens of (draft_ar + verify(1, context) + overhead(1))
    projected speedup = AR ms per token / the method's

which is the projection of `speedup_decode` (graft/metrics.py: baseline seconds per step token over the
method's, prefill excluded): the same tokens, timed by a profile instead of by the run.

A `CostProfile` holds verify(N, context) as a table measured by `python -m graft.costmodel profile` on one
device, the per-step overhead of the decode loop (topology, acceptance, cache commit, bookkeeping: it grows
with N, and moving an accepted path in the cache adds to it) and, where measured, each drafter's ms per step.
A projection is a model: it replays recorded acceptance (which does not depend on the device) against costs
measured elsewhere; it is not a run. Pure functions: no torch, and no import of the CPU engine (graft.methods
reads this module; tests/test_structure.py keeps the core off graft.cpu).

The commands (`python -m graft.costmodel <command>`, graft/costmodel/__main__.py):
- profile (profile.py): measure a device's CostProfile;
- project (project.py): projected speedups of recorded runs beside the measured ones;
- forward (forward.py): the target forward's cost per fast path: bandwidth and compute roofs, verify times.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from graft.schema import ConfigError

NODE_COUNTS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
AR = "ar"  # the baseline's name in records and in a profile's draft costs


def interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear y(x) through the points (xs ascending), held at the first below them and extrapolated
    beyond the last with the measured slope: a larger tree or context than measured is never free. The slope
    is the last segment's or the whole range's, whichever is steeper (one noisy last segment cannot flatten
    it), and never negative."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"need as many ys as xs, at least one; got {len(xs)} and {len(ys)}")
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        if len(xs) == 1:
            return float(ys[0])
        last = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        whole = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
        return float(ys[-1] + max(last, whole, 0.0) * (x - xs[-1]))
    right = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class CostProfile:
    """One device's costs for one target. Tables are row = context, column = node count."""

    device: str  # the machine, e.g. "cpu: AMD EPYC 7B13 (2 threads, AVX2)" or "cuda: NVIDIA H200 x1"
    model: str
    nodes: list[int]  # ascending tree sizes, root included
    contexts: list[int]  # ascending committed-context lengths (cache positions before the tree)
    verify_table_ms: list[list[float]]  # [len(contexts)][len(nodes)] median verify forward ms
    overhead_table_ms: list[float]  # [len(nodes)] loop ms per step outside the forward and the drafter
    # extra ms when the accepted path must be moved down in the cache (every layer's keys and values gathered):
    # a tree's path of 2+ tokens off its first nodes; a step that keeps only the root moves nothing
    commit_move_ms: float = 0.0
    draft_step_ms: dict[str, float] = field(default_factory=dict)  # {method or "ar": mean draft ms per step}
    meta: dict = field(default_factory=dict)  # how it was measured (repeats, fast path, date, versions)
    # what else the costs depend on (graft/costmodel/measure.py `identity`): a profile is the target's only where
    # these match; profiles written before they were recorded leave them empty
    model_hash: str = ""  # a hash of the model's shape (layers, widths, vocabulary, experts)
    dtype: str = ""
    engine: str = ""  # the backend and its forward: products, native loop, attention, compile
    # a mixture-of-experts target's experts (graft/costmodel/measure.py `measure_experts`; empty for a dense one):
    # experts (per layer), top_k, layers (MoE layers), experts_touched [len(nodes)] (the distinct experts per layer
    # the profile's verify of each node count read), the pinned-routing sweep (sweep_nodes, sweep_experts,
    # sweep_ms) and expert_ms, the ms one more expert read costs in one layer (the sweep's slope)
    moe: dict = field(default_factory=dict)

    def __post_init__(self):
        if sorted(self.nodes) != list(self.nodes) or sorted(self.contexts) != list(self.contexts):
            raise ValueError("profile nodes and contexts must be ascending")
        if len(self.verify_table_ms) != len(self.contexts) or any(
            len(row) != len(self.nodes) for row in self.verify_table_ms
        ):
            raise ValueError(f"verify_table_ms must be [{len(self.contexts)} contexts][{len(self.nodes)} nodes]")
        if len(self.overhead_table_ms) != len(self.nodes):
            raise ValueError(f"overhead_table_ms must have one value per node count ({len(self.nodes)})")
        if self.moe and len(self.moe.get("experts_touched", [])) != len(self.nodes):
            raise ValueError(f"moe.experts_touched must have one value per node count ({len(self.nodes)})")
        self.check_values()

    def check_values(self) -> None:
        """Every count a whole number >= 1 (contexts >= 0) and every cost a finite number of ms, a forward's > 0:
        a NaN, infinite, negative or zero verify cost would silently turn a budget choice into plain decoding
        or the whole cap (graft/methods/auto_budget.py divides by it). The error names the key and the value."""

        def refuse(key: str, value, expected: str) -> None:
            raise ValueError(f"{key}={value!r}: expected {expected}")

        for key, values, least in (("nodes", self.nodes, 1), ("contexts", self.contexts, 0)):
            for i, value in enumerate(values):
                if isinstance(value, bool) or not isinstance(value, int) or value < least:
                    refuse(f"{key}[{i}]", value, f"a whole number >= {least}")
        costs = [
            (f"verify_table_ms[{r}][{c}]", v, True)
            for r, row in enumerate(self.verify_table_ms)
            for c, v in enumerate(row)
        ]
        costs += [(f"overhead_table_ms[{i}]", v, False) for i, v in enumerate(self.overhead_table_ms)]
        costs += [("commit_move_ms", self.commit_move_ms, False)]
        costs += [(f"draft_step_ms[{name!r}]", v, False) for name, v in self.draft_step_ms.items()]
        costs += [("moe.expert_ms", self.moe["expert_ms"], False)] if "expert_ms" in self.moe else []
        for key, value, forward in costs:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0 or (forward and value == 0):
                refuse(key, value, "a finite number of ms > 0" if forward else "a finite number of ms >= 0")

    def verify_ms(self, nodes: float, context: float, experts: float | None = None) -> float:
        """Verify forward ms for a tree of `nodes` on `context` cached positions: linear in nodes within
        each measured context, then linear across contexts; beyond the table, extrapolated (`interpolate`).
        On an MoE target, `experts` (the distinct experts per layer the tree's routing touched, where a record
        knows it) re-costs the experts read: expert_ms per expert per layer above or below what the profile's
        own trees of that size touched. Without it, the profile's routing stands."""
        per_context = [interpolate(nodes, self.nodes, row) for row in self.verify_table_ms]
        ms = interpolate(context, self.contexts, per_context)
        if experts is None or not self.moe:
            return ms
        return max(0.0, ms + self.expert_read_ms(experts - self.experts_touched(nodes)))

    def experts_touched(self, nodes: float) -> float:
        """The distinct experts per MoE layer the profile's verify of `nodes` nodes read (interpolated)."""
        return interpolate(nodes, self.nodes, self.moe["experts_touched"]) if self.moe else 0.0

    def expert_read_ms(self, experts: float) -> float:
        """What reading `experts` more experts in every MoE layer costs (negative for fewer)."""
        return self.moe.get("expert_ms", 0.0) * self.moe.get("layers", 0) * experts if self.moe else 0.0

    def overhead_ms(self, nodes: float, accepted: int = 1) -> float:
        """The loop's ms per step outside the forward and the drafter. Records do not say whether a step's
        accepted path sat in place, so a step of 3+ nodes that committed 2+ tokens is taken to be a tree's,
        whose path is moved (a chain's is not: there this overstates by commit_move_ms)."""
        moved = accepted >= 2 and nodes >= 3
        return interpolate(nodes, self.nodes, self.overhead_table_ms) + (self.commit_move_ms if moved else 0.0)

    def draft_ms(self, method: str) -> float:
        if method not in self.draft_step_ms:
            measured = ", ".join(sorted(self.draft_step_ms)) or "none"
            raise KeyError(f"the profile has no draft cost for {method!r} (measured: {measured})")
        return self.draft_step_ms[method]

    def scaled(self, factor: float) -> "CostProfile":
        """The same curves at another machine speed: every forward and loop cost times `factor`."""
        return replace(
            self,
            verify_table_ms=[[ms * factor for ms in row] for row in self.verify_table_ms],
            overhead_table_ms=[ms * factor for ms in self.overhead_table_ms],
            commit_move_ms=self.commit_move_ms * factor,
            meta={**self.meta, "scaled_by": factor},
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> "CostProfile":
        data = dict(data)
        whole = lambda n: int(n) if isinstance(n, float) and n.is_integer() else n  # noqa: E731  (4.0 -> 4; 4.5 stays, refused)
        data["nodes"] = [whole(n) for n in data["nodes"]]
        data["contexts"] = [whole(c) for c in data["contexts"]]
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "CostProfile":
        """The profile in `path`; a file that is not one (torn, not JSON, a field missing) is a one-line error."""
        try:
            raw = json.loads(Path(path).read_text())
            if not isinstance(raw, dict):
                raise ValueError(f"a JSON {type(raw).__name__}, not an object")
            return cls.from_json(raw)
        except (ValueError, KeyError, TypeError) as err:
            reason = f"no field {err}" if isinstance(err, KeyError) else str(err).splitlines()[0]
            raise ConfigError(
                f"{path} is not a cost profile ({reason}); measure one: python -m graft.costmodel profile"
            )


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
    from graft.analysis import run_sides

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
    if profile is not None:
        split["profile_verify_ms_per_step"] = sum(profile.verify_ms(s.nodes, s.context) for s in steps) / n
        split["profile_overhead_ms_per_step"] = sum(profile.overhead_ms(s.nodes, s.accepted) for s in steps) / n
    return split


def ar_ms_per_token(steps: Iterable[Step], profile: CostProfile, draft_ms: float) -> float:
    """The baseline's ms per token over the same tokens: a step that committed `a` tokens at context c stands
    for `a` one-node steps at contexts c .. c + a - 1."""
    total, tokens = 0.0, 0
    for step in steps:
        for offset in range(step.accepted):
            total += draft_ms + profile.verify_ms(1, step.context + offset) + profile.overhead_ms(1)
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
    """
    needed = ("accepted", "nodes", "context", "draft_ms")
    steps = [s if isinstance(s, Step) else Step(**{k: s[k] for k in needed}, experts=s.get("experts")) for s in steps]
    if not steps:
        raise ValueError("no steps to project")
    if ar_draft_ms is None:
        ar_draft_ms = profile.draft_step_ms.get(AR, 0.0)
    drafts = [s.draft_ms if draft_ms is None else draft_ms for s in steps]
    verifies = [profile.verify_ms(s.nodes, s.context, s.experts) for s in steps]
    overheads = [profile.overhead_ms(s.nodes, s.accepted) for s in steps]
    tokens = sum(s.accepted for s in steps)
    step_ms = (sum(drafts) + sum(verifies) + sum(overheads)) / len(steps)
    ms_per_token = step_ms * len(steps) / tokens  # = mean(step time) / mean(accepted)
    baseline = ar_ms_per_token(steps, profile, ar_draft_ms)
    return {
        "kind": "projection",
        "device": profile.device,
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
