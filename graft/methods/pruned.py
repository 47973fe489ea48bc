"""EAGLE-3 with confidence checkpoints (the pruned tree): drafting stops early when the draft is unsure.

At checkpoint i (after `checkpoints[i]` expansion levels; 0 = when the root's children are scored) the
draft's confidence is c = exp(max cumulative log-probability over the frontier). The first checkpoint
where c < thresholds[i] stops the expansion and keeps the best `draft_nodes[i]` nodes (root included) of
what was scored so far; if none fires, the dense tree of `total_tokens` is kept. `draft_nodes` is given
for a budget of `reference_budget` nodes and scales with `total_tokens`. Here the freed budget stays
unused: fewer nodes are verified. Graft (graft/methods/graft.py) spends it on retrieved tokens.

Defaults (checkpoints after 0, 1 and 5 levels; splits 8 / 24 / 40 of 60; thresholds 0.35 / 0.25 / 0.15)
are the paper's 60-node example as quoted by readers of arXiv 2605.20104 (see ../shared/notes/reference.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from graft.drafter import SequenceState, register
from graft.methods.eagle3 import Candidates, Eagle3Drafter, Eagle3Params, expand, select
from graft.tree import DraftTree

DENSE = "dense"


@dataclass
class PruneParams(Eagle3Params):
    checkpoints: list[int] = field(default_factory=lambda: [0, 1, 5])  # expansion levels done at each check
    thresholds: list[float] = field(default_factory=lambda: [0.35, 0.25, 0.15])
    draft_nodes: list[int] = field(default_factory=lambda: [8, 24, 40])  # root included, for reference_budget
    reference_budget: int = 60

    def __post_init__(self):
        super().__post_init__()
        n = len(self.checkpoints)
        if not (len(self.thresholds) == len(self.draft_nodes) == n):
            raise ValueError(f"checkpoints {self.checkpoints}, thresholds {self.thresholds} and draft_nodes {self.draft_nodes} must have the same length")
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or any(c < 0 for c in self.checkpoints):
            raise ValueError(f"checkpoints must be distinct, ascending and >= 0; got {self.checkpoints}")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"thresholds are probabilities in [0, 1]; got {self.thresholds}")
        if any(not 1 <= d <= self.reference_budget for d in self.draft_nodes):
            raise ValueError(f"draft_nodes must lie in [1, reference_budget={self.reference_budget}]; got {self.draft_nodes}")


def scaled_split(draft_nodes: int, total_tokens: int, reference_budget: int) -> int:
    """Draft nodes (root included) for `total_tokens` from a split given for `reference_budget`: at least root + 1."""
    return max(2, min(total_tokens, round(draft_nodes * total_tokens / reference_budget)))


def stage_at(level: int, frontier_scores: Tensor | list[float], checkpoints: list[int], thresholds: list[float]) -> int | None:
    """Index of the checkpoint that fires after `level` expansion levels, or None: it fires when
    exp(max frontier cumulative log-prob) < its threshold."""
    if level not in checkpoints:
        return None
    i = checkpoints.index(level)
    best = float(max(frontier_scores)) if isinstance(frontier_scores, list) else float(frontier_scores.max())
    return i if math.exp(best) < thresholds[i] else None


def stage_name(params: PruneParams, stage: int | None) -> str:
    return DENSE if stage is None else f"check@{params.checkpoints[stage]}"


@register("pruned", params=PruneParams, description="EAGLE-3 tree cut at confidence checkpoints; freed budget unused")
class PrunedDrafter(Eagle3Drafter):
    params: PruneParams

    def _draft_budget(self, stage: int | None) -> int:
        p = self.params
        return p.total_tokens if stage is None else scaled_split(p.draft_nodes[stage], p.total_tokens, p.reference_budget)

    def _expand(self, stop: bool = True) -> tuple[Candidates, int | None]:
        """Expand with the checkpoints; `stop=False` records the first stage that fires but drafts to full depth."""
        p = self.params
        fired: list[int] = []

        def checkpoint(level: int, scores: Tensor) -> bool:
            if fired:
                return False
            stage = stage_at(level, scores, p.checkpoints, p.thresholds)
            if stage is not None:
                fired.append(stage)
            return stage is not None and stop

        found = expand(self.head, self._embed, self.cache, self._catch_up(), p.depth, p.top_k, checkpoint)
        return found, (fired[0] if fired else None)

    def _pruned_tree(self, state: SequenceState, stop: bool = True) -> tuple[DraftTree, int | None]:
        found, stage = self._expand(stop)
        return select(found, state.root, self._draft_budget(stage) - 1), stage

    @torch.inference_mode()
    def propose(self, state: SequenceState) -> DraftTree:
        tree, stage = self._pruned_tree(state)
        self.last_info = {"stage": stage_name(self.params, stage)}
        return tree
