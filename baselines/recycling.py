"""Token Recycling alone (arXiv 2408.08696): the successor table, refreshed from every verification, read
through one static template rooted at the current token. No draft model."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graft.drafter import Drafter, PrefillInfo, SequenceState, StepFeedback, register
from graft.grafting import graft
from graft.retrieval.recycling import DEFAULT_RANK_PRIOR, Recycler
from graft.tree import DraftTree


@dataclass
class RecyclingParams:
    total_tokens: int = 80  # template nodes, root included (the paper's template has 80)
    k: int = 8
    max_depth: int = 6
    rank_prior: list[float] = field(default_factory=lambda: list(DEFAULT_RANK_PRIOR))

    def __post_init__(self):
        if self.total_tokens < 2 or not 1 <= self.k <= len(self.rank_prior) or self.max_depth < 1:
            raise ValueError(f"need total_tokens >= 2, 1 <= k <= {len(self.rank_prior)}, max_depth >= 1; got {self.total_tokens}, {self.k}, {self.max_depth}")


@register("recycling", params=RecyclingParams, description="Token Recycling: successor table + static template")
class RecyclingDrafter(Drafter):
    params: RecyclingParams

    def __init__(self, target, params: RecyclingParams):
        super().__init__(target, params)
        self.recycler = Recycler(target.vocab_size, params.k, params.max_depth, params.rank_prior, target.device)

    def max_nodes(self) -> int:
        return self.params.total_tokens

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        state = prefill.state
        self.recycler.reset(state.tokens[: state.prompt_len], prefill.forward.logits)

    @torch.inference_mode()
    def propose(self, state: SequenceState) -> DraftTree:
        n = self.params.total_tokens
        tokens, parents = self.recycler.subtree(state.root, n)
        return graft(DraftTree.root_only(state.root, self.target.device), 0, tokens, parents, n - 1).tree

    @torch.inference_mode()
    def update(self, step: StepFeedback) -> None:
        self.recycler.observe(step.tree.tokens, step.forward.logits, step.acceptance.index)
