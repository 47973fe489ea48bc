"""A machine's measured costs: verify ms per tree size and context, the loop's overhead, each drafter's ms per
step (`CostProfile`), and which CPU they were measured on. graft_auto and eagle3_auto choose their node budget
from one (graft/budget/measure.py measures it at start-up); the cost model (graft/costmodel/) projects recorded
runs with one."""

from __future__ import annotations

import bisect
import json
import math
import platform
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

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
    # what else the costs depend on (graft/budget/measure.py `identity`): a profile is the target's only where
    # these match; profiles written before they were recorded leave them empty
    model_hash: str = ""  # a hash of the model's shape (layers, widths, vocabulary, experts)
    dtype: str = ""
    engine: str = ""  # the backend and its forward: products, native loop, attention, compile
    # a mixture-of-experts target's experts (graft/budget/measure.py `measure_experts`; empty for a dense one):
    # experts (per layer), top_k, layers (MoE layers), experts_touched [len(nodes)] (the distinct experts per layer
    # the profile's verify of each node count read), the pinned-routing sweep (sweep_nodes, sweep_experts,
    # sweep_ms) and expert_ms, the ms one more expert read costs in one layer (the sweep's slope)
    moe: dict = field(default_factory=dict)
    # the sequences one verify forward held: at B, verify_table_ms[c][n] is one forward of B trees of n nodes each
    # (every row after c cached positions); overhead_table_ms and draft_step_ms stay per sequence
    batch: int = 1

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
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            refuse("batch", self.batch, "a whole number >= 1 (the sequences one verify forward held)")
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

    def verify_share_ms(self, nodes: float, context: float, experts: float | None = None) -> float:
        """One sequence's share of a verify forward at the profile's batch: the forward of `batch` trees of
        `nodes` nodes each, divided among them (at batch 1, verify_ms itself)."""
        return self.verify_ms(nodes, context, experts) / self.batch

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
        data = asdict(self)
        if self.batch == 1:  # a batch-1 profile writes the JSON it always did
            del data["batch"]
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> "CostProfile":
        data = dict(data)
        whole = lambda n: int(n) if isinstance(n, float) and n.is_integer() else n  # noqa: E731  (4.0 -> 4; 4.5 stays, refused)
        data["nodes"] = [whole(n) for n in data["nodes"]]
        data["contexts"] = [whole(c) for c in data["contexts"]]
        if "batch" in data:  # a profile written before batches were measured has none: batch 1
            data["batch"] = whole(data["batch"])
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
            ) from None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
