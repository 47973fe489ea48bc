"""Grafting: unite a draft tree with a retrieved subtree that hangs from one of its nodes, within a budget.

The retrieved subtree's node 0 is the *anchor*, an existing draft node (the root for Graft's paper form).
A retrieved node whose whole path from the root spells the same tokens as a draft node's path is that
draft node (merged, same token under the same parent), so it costs nothing; the slots that merges and
unknown entries (-1) free go to the next retrieved nodes in the subtree's order. Retrieved nodes are
offered in the subtree's order (parents first), so any prefix of the new nodes is ancestor-closed.

graft() works on the host (a dict of the draft's paths); its fixed-size form, graft_fixed() in
graft/fixed_size.py, is tensor code with shapes fixed by the inputs, so that a GPU step needs no host read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from graft.fixed_size import compact, graft_fixed
from graft.ops import upload
from graft.tree import DraftTree, NodeSource


@dataclass
class GraftResult:
    tree: DraftTree
    added: int  # retrieved nodes added to the tree
    merged: int  # retrieved nodes that the draft already held


def graft(
    draft: DraftTree,
    anchor: int,
    tokens: Tensor,
    parents: Tensor,
    room: int,
    source: NodeSource = NodeSource.RETRIEVAL,
    scores: Tensor | None = None,
) -> GraftResult:
    """Add up to `room` nodes of the retrieved subtree (tokens [m], parents [m], node 0 = the anchor's token)
    under draft node `anchor`. Unknown retrieved tokens (-1) and their descendants are skipped. The new nodes
    are marked `source`, with the subtree's `scores` [m] where given (else -inf).

    The host path: a draft of a few dozen nodes is keyed by its token paths in a dict, which costs less than
    the tensor form's (graft/fixed_size.py: graft_fixed's) few dozen tiny ops."""
    device = draft.tokens.device
    n, m = draft.num_nodes, tokens.shape[0]
    if m <= 1 or room <= 0:
        return GraftResult(draft, 0, 0)
    host = torch.cat([draft.tokens, draft.parents, tokens, parents]).tolist()  # one read (a sync on a GPU)
    d_tokens, d_parents, r_tokens, r_parents = host[:n], host[n : 2 * n], host[2 * n : 2 * n + m], host[2 * n + m :]
    d_paths: list[tuple] = [(d_tokens[0],)]
    node_at: dict[tuple, int] = {}  # a draft path -> its first node; empty slots (-1) take no merge
    for i in range(1, n):
        d_paths.append(d_paths[d_parents[i]] + (d_tokens[i],))
        if d_tokens[i] >= 0:
            node_at.setdefault(d_paths[i], i)
    r_paths, place = [d_paths[anchor]], [anchor]  # retrieved node i's path from the draft root, its node
    unknown, kept, merged = [False], [], 0
    for i in range(1, m):
        parent = r_parents[i]
        r_paths.append(r_paths[parent] + (r_tokens[i],))
        unknown.append(unknown[parent] or r_tokens[i] < 0)
        same = node_at.get(r_paths[i])
        if unknown[i]:
            place.append(-1)
        elif same is not None:
            place.append(same)
            merged += 1
        elif len(kept) < room:
            place.append(n + len(kept))
            kept.append(i)
        else:
            place.append(-1)  # beyond the room: neither it nor its descendants are added
    added = len(kept)
    old_sources = (
        draft.sources
        if draft.sources is not None
        else torch.full((n,), int(NodeSource.DRAFT), dtype=torch.int8, device=device)
    )
    old_scores = draft.scores if draft.scores is not None else torch.zeros(n, device=device)
    if scores is not None:
        new_scores = torch.cat([old_scores, scores[upload(kept, device)]])
    else:
        new_scores = torch.nn.functional.pad(old_scores, (0, added), value=float("-inf"))
    # the united tokens and parents from the host lists in one copy up
    tokens, parents = upload(
        d_tokens + [r_tokens[i] for i in kept] + d_parents + [place[r_parents[i]] for i in kept], device
    ).view(2, n + added)
    tree = DraftTree(
        tokens=tokens,
        parents=parents,
        scores=new_scores,
        sources=torch.nn.functional.pad(old_sources, (0, added), value=int(source)),
    )
    return GraftResult(tree, added, merged)


class Grafted:
    """A tree as retrieved subtrees are grafted onto it one after another, within `room` new nodes.

    `fixed_size`: fixed shapes (graft/fixed_size.py: graft_fixed): room, added and merged are 0-d tensors, the
    tree keeps empty slots, and finish(size) compacts it to the step's budget."""

    def __init__(self, tree: DraftTree, room, fixed_size: bool = False):
        self.tree, self.room, self.added, self.merged = tree, room, 0, 0
        self.fixed_size = fixed_size

    def finish(self, size: int) -> DraftTree:
        return compact(self.tree, size) if self.fixed_size else self.tree

    def add_subtree(
        self,
        anchor: int,
        tokens: Tensor,
        parents: Tensor,
        room: int | None = None,
        chain: bool = False,
        source: NodeSource = NodeSource.RETRIEVAL,
        scores: Tensor | None = None,
    ) -> None:
        """Graft the subtree (tokens [m], parents [m], node 0 = the anchor's token) under node `anchor`.
        `chain`: a chain of known tokens, which on a bare root needs no merging. `source` and `scores` [m]: how
        the new nodes are marked (host path; the fixed-size one grafts retrieval only)."""
        if self.fixed_size:
            room = self.room if room is None else torch.clamp(self.room, max=room)
            self.tree, added, merged = graft_fixed(self.tree, anchor, tokens, parents, room)
            self.room = self.room - added
            self.added = self.added + added
            self.merged = self.merged + merged
            return
        room = self.room if room is None else min(room, self.room)
        if chain and self.tree.num_nodes == 1 and room > 0 and tokens.shape[0] > 1:
            kept = tokens[1 : room + 1]
            parents = torch.arange(-1, kept.shape[0], device=tokens.device)
            result = GraftResult(
                DraftTree.build(torch.cat([self.tree.tokens, kept]), parents, NodeSource.RETRIEVAL), kept.shape[0], 0
            )
        else:
            result = graft(self.tree, anchor, tokens, parents, room, source, scores)
        self.tree = result.tree
        self.room -= result.added
        self.added += result.added
        self.merged += result.merged
