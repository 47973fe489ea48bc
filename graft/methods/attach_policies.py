"""Graft's grafting policies: where retrieved subtrees join the pruned draft tree.

Graft (arXiv 2605.20104) is a composition (configs/method/graft.yaml): the EAGLE-3 source pruned at
confidence checkpoints (graft/methods/pruned.py), the Token-Recycling retriever (baselines/recycling.py)
and the policy below that grafts its subtree at the root, so that one step reads

    draft, pruned (source + split) -> retrieve (retrievers) -> graft (attach policy) -> verify (decode loop)

Policies (method.attach):
- root:   the paper's form: every retriever's subtree hangs from the root, in the order of method.retrieval;
- tail:   Graft(TAIL): below the deepest draft node (the end of a confident draft chain);
- leaves: beyond the paper: the best draft leaves (by cumulative log-prob) continued with chains read
          below them by the retrievers of method.retrieval (recycling: the rank-0 chain of the leaf's token;
          suffix and pld: what followed the text + the leaf's path), up to `leaf_count` leaves sharing the budget;
- both:   leaves first with `leaf_share` of the budget, then the root.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft.grafting import Grafted
from graft.ops import upload
from graft.parts import AttachPolicy, Retrieval
from graft.registry import register
from graft.tree import topology


def graft_at(anchor: int, grafted: Grafted, retrieval: Retrieval) -> None:
    """Each retriever's subtree below node `anchor`, in order, while there is room."""
    for retriever in retrieval.retrievers:
        if grafted.fixed_size:  # the room is on the device: read a fixed-size subtree, graft_fixed caps it
            found = retrieval.made(retriever, anchor, None, grafted.tree.num_nodes) or retrieval.below(
                retriever, grafted.tree.tokens[anchor], None, grafted.tree.num_nodes
            )
            grafted.add_subtree(anchor, found.tokens, found.parents)
            continue
        if grafted.room <= 0:
            break
        room, nodes = grafted.room, grafted.tree.num_nodes
        found = retrieval.made(retriever, anchor, room, nodes) or retrieval.below(
            retriever, grafted.tree.tokens[anchor], room, nodes
        )
        if found is not None:
            grafted.add_subtree(anchor, found.tokens, found.parents, chain=found.chain)


@register("attach", "root", description="retrieved subtrees hang from the root (the paper's Graft)")
class AtRoot(AttachPolicy):
    supports_fixed_size = True
    reads_root = True

    def __init__(self, params=None):
        self.params = params

    def place(self, grafted: Grafted, retrieval: Retrieval) -> None:
        graft_at(0, grafted, retrieval)


@register("attach", "tail", description="retrieved subtrees hang from the deepest draft node (Graft(TAIL))")
class AtTail(AtRoot):
    supports_fixed_size = False  # finds the deepest node on the host
    reads_root = False

    def place(self, grafted: Grafted, retrieval: Retrieval) -> None:
        deepest = int(torch.argmax(topology(grafted.tree.parents, 0).depth)) if grafted.tree.num_nodes > 1 else 0
        graft_at(deepest, grafted, retrieval)


@dataclass
class LeafParams:
    leaf_count: int = 4  # best draft leaves continued
    leaf_share: float = 0.5  # attach=both: share of the retrieval budget for the leaves

    def __post_init__(self):
        if self.leaf_count < 1 or not 0.0 <= self.leaf_share <= 1.0:
            raise ValueError(f"need leaf_count >= 1 and 0 <= leaf_share <= 1; got {self.leaf_count}, {self.leaf_share}")


def best_leaves(tree, count: int) -> list[int]:
    """The `count` best leaves of `tree` by score (cumulative log-prob), best first: nodes other than the root
    with no children. Fewer when the tree has fewer; internal nodes never stand in for missing leaves."""
    has_child = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.tokens.device)  # [num_nodes]
    has_child[tree.parents[1:]] = True
    has_child[0] = True  # the root is never a leaf to continue
    scores = tree.scores if tree.scores is not None else torch.zeros(tree.num_nodes, device=tree.tokens.device)
    leaves = torch.nonzero(~has_child).squeeze(1)  # [num_leaves]  # sync ok: host-path trees only
    order = torch.sort(scores[leaves], descending=True, stable=True).indices  # ties: the earlier node first
    return leaves[order[:count]].tolist()


def path_to(node: int, parents: list[int], tokens: list[int]) -> list[int]:
    """The tokens from the root's child down to `node` (what the node adds to the committed text)."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


@register("attach", "leaves", params=LeafParams, description="chains below the best draft leaves")
class AtLeaves(AttachPolicy):
    """Continue the best draft leaves with chains read below them, from every retriever in method.retrieval
    that can read below a draft node (in that order: a later one fills what an earlier one left of the
    leaf's share). The share is split over the leaves that exist, best leaves taking the remainder, and what
    one leaf leaves unused (a short or unknown chain) passes to the next."""

    needs_reader = True
    share_of_room = 1.0

    def __init__(self, params: LeafParams):
        self.params = params

    def place(self, grafted: Grafted, retrieval: Retrieval) -> None:
        if grafted.tree.num_nodes > 1:
            self._continue_leaves(grafted, retrieval, int(grafted.room * self.share_of_room))

    def _continue_leaves(self, grafted: Grafted, retrieval: Retrieval, share: int) -> None:
        readers = [r for r in retrieval.retrievers if r.reads_at_any_token]
        tree = grafted.tree  # the draft before any chain: the leaves are the draft's own
        leaves = best_leaves(tree, self.params.leaf_count)
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()  # paths walked on the host: a few nodes
        left = min(share, grafted.room)
        for i, leaf in enumerate(leaves):
            budget = -(-left // (len(leaves) - i))  # ceil: the better leaves take the remainder
            if budget <= 0:
                break
            path = upload(path_to(leaf, parents, tokens), tree.tokens.device)
            room_before = grafted.room
            for reader in readers:
                used = room_before - grafted.room
                if used >= budget:
                    break
                # read the whole share below the leaf: nodes an earlier reader already put there merge for free
                found = retrieval.chain_below(reader, path, budget + 1)
                if found is not None:
                    grafted.add_subtree(leaf, found.tokens, found.parents, room=budget - used)
            left -= room_before - grafted.room


@register("attach", "both", params=LeafParams, description="leaves first (leaf_share of the budget), then the root")
class AtLeavesAndRoot(AtLeaves):
    reads_root = True

    def place(self, grafted: Grafted, retrieval: Retrieval) -> None:
        if grafted.tree.num_nodes > 1:
            self._continue_leaves(grafted, retrieval, int(grafted.room * self.params.leaf_share))
        graft_at(0, grafted, retrieval)
