"""The autoregressive baseline: the same decode loop with a drafter that proposes only the root, so every
step verifies one token and commits it (tau = 1.00 exactly). Every speedup is measured against it."""

from __future__ import annotations

from graft.drafter import Drafter, Proposal, SequenceState
from graft.registry import register
from graft.tree import DraftTree


@register("drafter", "ar", description="autoregressive baseline: the same loop, one token per step")
class Autoregressive(Drafter):
    def propose(self, state: SequenceState) -> Proposal:
        device = self.target.device
        return Proposal(DraftTree.root_only(state.root_on(device), device=device))
