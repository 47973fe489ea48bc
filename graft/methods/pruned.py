"""Budget splits that prune the draft where it is unsure (method.split), for any draft source.

- stage (the pruned tree; Graft): at checkpoint i (after `checkpoints[i]` expansion levels; 0 = when the
  root's children are scored) the draft's confidence is c = exp(max cumulative log-probability over the
  frontier). The first checkpoint where c < thresholds[i] stops the expansion (with `prune: false` it only
  records the stage: Graft w/o prune) and keeps the best `draft_tokens[i]` nodes (root included) of
  `reference_budget`, scaled to total_tokens; when none fires the draft keeps the whole budget. The
  defaults (checkpoints after 0, 1 and 5 levels; draft tokens 8 / 24 / 40 of 60; thresholds 0.35 / 0.25 /
  0.15) are the paper's 60-node example as quoted by readers of arXiv 2605.20104 (results/paper/README.md lists
  the sources).
- fixed (Graft(ROOT) ablation): no checkpoints; always `fixed_draft_tokens` of `reference_budget`.
- confident (Graft(TAIL)): drafting stops once the frontier's confidence falls below `tail_threshold`;
  the draft keeps every node at least that confident.
- prefix (Graft(TAIL) on blocks): per position, the best frontier node's own probability (its score
  less the previous level's best); the draft keeps the leading positions where it is >= `prefix_threshold`
  and stops at the first below it. For a chain (a DFlash block) that is each token's own probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from graft.fixed_size import Deferred
from graft.parts import Split
from graft.registry import register

DENSE = "dense"


def scaled_split(draft_tokens: int, total_tokens: int, reference_budget: int) -> int:
    """Draft tokens (root included) for `total_tokens` from a split given for `reference_budget`: at least root + 1,
    never more than the budget."""
    return min(total_tokens, max(2, round(draft_tokens * total_tokens / reference_budget)))


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}")


def stage_at(
    level: int, frontier_scores: Tensor | list[float], checkpoints: list[int], thresholds: list[float]
) -> int | None:
    """Index of the checkpoint that fires after `level` expansion levels, or None: it fires when
    exp(max frontier cumulative log-prob) < its threshold."""
    if level not in checkpoints:
        return None
    i = checkpoints.index(level)
    best = float(max(frontier_scores)) if isinstance(frontier_scores, list) else float(frontier_scores.max())
    return i if math.exp(best) < thresholds[i] else None


@dataclass
class StageParams:
    checkpoints: list[int] = field(default_factory=lambda: [0, 1, 5])  # expansion levels done at each check
    thresholds: list[float] = field(default_factory=lambda: [0.35, 0.25, 0.15])
    draft_tokens: list[int] = field(default_factory=lambda: [8, 24, 40])  # root included, of reference_budget
    reference_budget: int = 60
    prune: bool = True  # stop drafting at the checkpoint that fires (False: record the stage, draft to full depth)

    def __post_init__(self):
        n = len(self.checkpoints)
        if not (len(self.thresholds) == len(self.draft_tokens) == n):
            raise ValueError(
                f"checkpoints {self.checkpoints}, thresholds {self.thresholds} and draft_tokens {self.draft_tokens} must have the same length"
            )
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or any(c < 0 for c in self.checkpoints):
            raise ValueError(f"checkpoints must be distinct, ascending and >= 0; got {self.checkpoints}")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"thresholds are probabilities in [0, 1]; got {self.thresholds}")
        # confidence only falls with depth, so the paper's stages relax the threshold and keep more nodes the later
        # they fire (0.35/0.25/0.15, 8/24/40); the other order is legal (0 and 1 force a stage, as tests do) but is
        # more often a reversed list, so it is said once
        if any(a < b for a, b in zip(self.thresholds, self.thresholds[1:])):
            _warn_once(
                f"method.thresholds={self.thresholds} increase from one checkpoint to the next: confidence only falls "
                "with depth, so a later checkpoint fires more often than an earlier one (the paper: 0.35/0.25/0.15); "
                "is the list reversed?"
            )
        if any(a > b for a, b in zip(self.draft_tokens, self.draft_tokens[1:])):
            _warn_once(
                f"method.draft_tokens={self.draft_tokens} decrease from one checkpoint to the next: a later stage, "
                "reached by a more confident draft, keeps fewer nodes (the paper: 8/24/40); is the list reversed?"
            )
        if any(not 1 <= d <= self.reference_budget for d in self.draft_tokens):
            raise ValueError(
                f"draft_tokens must lie in [1, reference_budget={self.reference_budget}]; got {self.draft_tokens}"
            )


@register(
    "split",
    "stage",
    params=StageParams,
    description="confidence checkpoints pick how much of the budget the draft keeps",
)
class StageSplit(Split):
    supports_fixed_size = True

    def __init__(self, params: StageParams):
        self.params = params
        self.fired: int | None = None
        self.fired_on_device: Tensor | None = None  # fixed-size: checkpoint index, len(checkpoints) = none fired
        self._tables: dict = {}

    def start(self) -> None:
        self.fired = None
        self.fired_on_device = None

    def stop_after(self, level: int, frontier_scores: Tensor) -> bool:
        p = self.params
        if self.fixed_size:  # decide on the device and draft on: level_cap() drops what the host path would not draft
            if level in p.checkpoints:
                i = p.checkpoints.index(level)
                none = len(p.checkpoints)
                if self.fired_on_device is None:
                    self.fired_on_device = torch.full((), none, dtype=torch.long, device=frontier_scores.device)
                fires = (frontier_scores.max().double().exp() < p.thresholds[i]) & (self.fired_on_device == none)
                self.fired_on_device = torch.where(fires, i, self.fired_on_device)
            return False
        if self.fired is not None:
            return False
        self.fired = stage_at(level, frontier_scores, p.checkpoints, p.thresholds)
        return self.fired is not None and p.prune

    def keep(self, scores: Tensor, total_tokens: int) -> int | Tensor:
        p = self.params
        if self.fixed_size:
            if self.fired_on_device is None:  # no checkpoint within the drafted depth
                return torch.full((), total_tokens, dtype=torch.long, device=scores.device)
            table = [scaled_split(d, total_tokens, p.reference_budget) for d in p.draft_tokens] + [total_tokens]
            return self._pick(table, scores.device)
        return (
            total_tokens
            if self.fired is None
            else scaled_split(p.draft_tokens[self.fired], total_tokens, p.reference_budget)
        )

    def levels_needed(self, total_tokens: int) -> int:
        return max(total_tokens - 2, *self.params.checkpoints)  # every checkpoint runs: keep() and label() read it

    def level_cap(self) -> Tensor | None:
        p = self.params
        if not (self.fixed_size and p.prune) or self.fired_on_device is None:
            return None
        return self._pick([*p.checkpoints, 1 << 30], self.fired_on_device.device)

    def _pick(self, values: list[int], device) -> Tensor:
        """0-d: values[the checkpoint that fired], through index_select (a 0-d tensor as an index reads it back)."""
        return self._on_device(values, device).index_select(0, self.fired_on_device.view(1))[0]

    def _on_device(self, values: list[int], device) -> Tensor:
        """A small constant table, copied to the device once (a copy per step would be a sync on CUDA)."""
        key = (tuple(values), str(device))
        if key not in self._tables:
            self._tables[key] = torch.tensor(values, device=device)
        return self._tables[key]

    def label(self) -> str | Deferred:
        checks = tuple(f"check@{c}" for c in self.params.checkpoints)
        if self.fixed_size:
            fired = self.fired_on_device
            return DENSE if fired is None else Deferred(fired, (*checks, DENSE))
        return DENSE if self.fired is None else checks[self.fired]


@dataclass
class FixedParams:
    fixed_draft_tokens: int = 40  # draft tokens (root included) of reference_budget, every step
    reference_budget: int = 60

    def __post_init__(self):
        if not 1 <= self.fixed_draft_tokens <= self.reference_budget:
            raise ValueError(
                f"fixed_draft_tokens must lie in [1, reference_budget={self.reference_budget}]; got {self.fixed_draft_tokens}"
            )


@register("split", "fixed", params=FixedParams, description="a fixed draft / retrieval split, no checkpoints")
class FixedSplit(Split):
    supports_fixed_size = True  # keep() is a constant

    def __init__(self, params: FixedParams):
        self.params = params

    def keep(self, scores: Tensor, total_tokens: int) -> int:
        return scaled_split(self.params.fixed_draft_tokens, total_tokens, self.params.reference_budget)

    def levels_needed(self, total_tokens: int) -> int:
        return max(self.keep(None, total_tokens) - 2, 0)

    def widest_useful(self, total_tokens: int) -> int:
        return max(self.keep(None, total_tokens) - 1, 1)

    def label(self) -> str:
        return "fixed"


@dataclass
class ConfidentParams:
    tail_threshold: float = 0.25  # keep draft nodes whose cumulative probability is at least this

    def __post_init__(self):
        if not 0.0 <= self.tail_threshold <= 1.0:
            raise ValueError(f"tail_threshold is a probability in [0, 1]; got {self.tail_threshold}")


@register(
    "split",
    "confident",
    params=ConfidentParams,
    description="keep the draft while it is at least tail_threshold confident",
)
class ConfidentSplit(Split):
    def __init__(self, params: ConfidentParams):
        self.floor = math.log(max(params.tail_threshold, 1e-30))
        self.kept = 0

    def stop_after(self, level: int, frontier_scores: Tensor) -> bool:
        return float(frontier_scores.max()) < self.floor

    def keep(self, scores: Tensor, total_tokens: int) -> int:
        self.kept = min(int((scores >= self.floor).sum()), total_tokens - 1, scores.shape[0])
        return self.kept + 1

    def label(self) -> str:
        return f"tail{self.kept}"


@dataclass
class PrefixParams:
    prefix_threshold: float = 0.3  # keep the leading draft positions whose own probability is at least this

    def __post_init__(self):
        if not 0.0 <= self.prefix_threshold <= 1.0:
            raise ValueError(f"prefix_threshold is a probability in [0, 1]; got {self.prefix_threshold}")


@register(
    "split",
    "prefix",
    params=PrefixParams,
    description="keep the leading draft positions whose own probability is at least prefix_threshold",
)
class PrefixSplit(Split):
    def __init__(self, params: PrefixParams):
        self.floor = math.log(max(params.prefix_threshold, 1e-30))
        self.kept, self.previous = 0, 0.0

    def start(self) -> None:
        self.kept, self.previous = 0, 0.0

    def stop_after(self, level: int, frontier_scores: Tensor) -> bool:
        best = float(frontier_scores.max())
        if best - self.previous < self.floor:
            return True
        self.kept, self.previous = level + 1, best
        return False

    def keep(self, scores: Tensor, total_tokens: int) -> int:
        return min(self.kept, total_tokens - 1) + 1

    def levels_needed(self, total_tokens: int) -> int:
        return max(total_tokens - 2, 0)  # the checkpoint at that level can still set kept to total_tokens - 1

    def label(self) -> str:
        return f"prefix{self.kept}"
