"""Graft's grafting policies: where retrieved subtrees join the pruned draft tree.

Graft (arXiv 2605.20104) is a composition (configs/method/graft.yaml): the EAGLE-3 source pruned at
confidence checkpoints (graft/methods/pruned.py), the Token-Recycling retriever (baselines/recycling.py)
and the policy below that grafts its subtree at the root, so that one step reads

    prune (source + split) -> retrieve (retrievers) -> graft (attach policy) -> verify (decode loop)

Policies (method.attach):
- root:   the paper's form: every retriever's subtree hangs from the root, in the order of method.retrieval;
- tail:   Graft(TAIL): below the deepest draft node (the end of a confident draft chain);
- leaves: beyond the paper: the best draft leaves (by cumulative log-prob) continued with rank-0 chains
          from a retriever that reads below any token (the recycling table), `leaf_count` leaves sharing
          the budget;
- both:   leaves first with `leaf_share` of the budget, then the root.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft.compose import AttachPolicy, Retriever
from graft.drafter import SequenceState
from graft.grafting import Grafted
from graft.registry import register
from graft.tree import topology


def graft_at(anchor: int, grafted: Grafted, retrievers: list[Retriever], state: SequenceState) -> None:
    """Each retriever's subtree below node `anchor`, in order, while there is room."""
    for retriever in retrievers:
        if grafted.room <= 0:
            break
        found = retriever.retrieve(state, grafted.tree.tokens[anchor], grafted.room, grafted.tree.num_nodes)
        if found is not None:
            grafted.attach(anchor, found.tokens, found.parents, chain=found.chain)


@register("attach", "root", description="retrieved subtrees hang from the root (the paper's Graft)")
class AtRoot(AttachPolicy):
    def __init__(self, params=None):
        self.params = params

    def attach(self, grafted: Grafted, retrievers: list[Retriever], state: SequenceState) -> None:
        graft_at(0, grafted, retrievers, state)


@register("attach", "tail", description="retrieved subtrees hang from the deepest draft node (Graft(TAIL))")
class AtTail(AtRoot):
    def attach(self, grafted: Grafted, retrievers: list[Retriever], state: SequenceState) -> None:
        deepest = int(torch.argmax(topology(grafted.tree.parents, 0).depth)) if grafted.tree.num_nodes > 1 else 0
        graft_at(deepest, grafted, retrievers, state)


@dataclass
class LeafParams:
    leaf_count: int = 4  # best draft leaves continued
    leaf_share: float = 0.5  # attach=both: share of the retrieval budget for the leaves

    def __post_init__(self):
        if self.leaf_count < 1 or not 0.0 <= self.leaf_share <= 1.0:
            raise ValueError(f"need leaf_count >= 1 and 0 <= leaf_share <= 1; got {self.leaf_count}, {self.leaf_share}")


@register("attach", "leaves", params=LeafParams, description="rank-0 chains below the best draft leaves")
class AtLeaves(AttachPolicy):
    needs_reader = True
    share_of_room = 1.0

    def __init__(self, params: LeafParams):
        self.params = params

    def attach(self, grafted: Grafted, retrievers: list[Retriever], state: SequenceState) -> None:
        if grafted.tree.num_nodes > 1:
            reader = next(r for r in retrievers if r.reads_at_any_token)
            self._continue_leaves(grafted, reader, int(grafted.room * self.share_of_room))

    def _continue_leaves(self, grafted: Grafted, reader: Retriever, share: int) -> None:
        tree = grafted.tree
        has_child = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.tokens.device)  # [num_nodes]
        has_child[tree.parents[1:]] = True
        leaf_scores = torch.where(has_child, float("-inf"), tree.scores)  # [num_nodes]
        leaf_scores[0] = float("-inf")
        leaves = torch.topk(leaf_scores, min(self.params.leaf_count, tree.num_nodes - 1)).indices.tolist()
        per_leaf = max(1, share // len(leaves))
        for leaf in leaves:
            budget = min(per_leaf, grafted.room)
            if budget <= 0:
                break
            found = reader.chain_at(tree.tokens[leaf], budget + 1)
            grafted.attach(leaf, found.tokens, found.parents, room=budget)


@register("attach", "both", params=LeafParams, description="leaves first (leaf_share of the budget), then the root")
class AtLeavesAndRoot(AtLeaves):
    def attach(self, grafted: Grafted, retrievers: list[Retriever], state: SequenceState) -> None:
        if grafted.tree.num_nodes > 1:
            reader = next(r for r in retrievers if r.reads_at_any_token)
            self._continue_leaves(grafted, reader, int(grafted.room * self.params.leaf_share))
        graft_at(0, grafted, retrievers, state)
