"""Grafting: unite a draft tree with a retrieved subtree that hangs from one of its nodes, within a budget.

The retrieved subtree's node 0 is the *anchor*, an existing draft node (the root for Graft's paper form).
A retrieved node whose whole path from the root spells the same tokens as a draft node's path is that
draft node (merged, same token under the same parent), so it costs nothing; the slots that merges and
unknown entries (-1) free go to the next retrieved nodes in the subtree's order. Retrieved nodes are
offered in the subtree's order (parents first), so any prefix of the new nodes is ancestor-closed.

graft() works on the host (a dict of the draft's paths); graft_static() is tensor code with fixed shapes, so
that a GPU step needs no host read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from graft.tree import DraftTree, NodeSource, topology
from graft.ops import upload


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
    the tensor form's (graft_static's) few dozen tiny ops."""
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
    new_scores = (
        scores[upload(kept, device)] if scores is not None else torch.full((added,), float("-inf"), device=device)
    )
    tree = DraftTree(
        tokens=torch.cat([draft.tokens, upload([r_tokens[i] for i in kept], device)]),
        parents=torch.cat([draft.parents, upload([place[r_parents[i]] for i in kept], device)]),
        scores=torch.cat([old_scores, new_scores]),
        sources=torch.cat([old_sources, torch.full((added,), int(source), dtype=torch.int8, device=device)]),
    )
    return GraftResult(tree, added, merged)


@dataclass
class Placement:
    """Where a retrieved subtree's nodes go (each [m]): merged into an equal draft node, unknown (itself or
    an ancestor -1), kept as new within the room, with its 1-based rank among the new nodes and its index
    in the grafted tree (merge target, n + rank - 1 for new nodes, the anchor for node 0)."""

    merged: Tensor
    unknown: Tensor
    keep: Tensor
    rank: Tensor
    place: Tensor

    @property
    def merged_count(self) -> Tensor:
        """0-d: retrieved nodes below the anchor that the draft already held."""
        return (self.merged[1:] & ~self.unknown[1:]).sum()


def place_retrieved(
    draft: DraftTree, anchor: int, tokens: Tensor, r_attn, r_paths: Tensor, d_paths: Tensor, room
) -> Placement:
    """The placement of a retrieved subtree from the paths of its nodes (r_paths [m, w]) and of the draft's
    (d_paths [n, w]), both from the draft root: equal rows are equal paths. An empty draft slot (token -1)
    takes no merge. `room` may be a 0-d tensor."""
    same = (r_paths[:, None, :] == d_paths[None, :, :]).all(-1) & (draft.tokens >= 0)[None, :]  # [m, n]
    merged = same.any(1)
    unknown = (r_attn.ancestors & (tokens < 0)[None, :]).any(1)
    new = ~merged & ~unknown
    new[0] = False
    rank = torch.cumsum(new.long(), 0)
    place = torch.where(merged, same.float().argmax(1), draft.num_nodes + rank - 1)
    place[0] = anchor
    return Placement(merged, unknown, new & (rank <= room), rank, place)


def dense_paths(tokens: Tensor, attn, width: int, offset: Tensor | int = 0, below_only: bool = False) -> Tensor:
    """[n, width] token at depth offset + d along each node's path (d = its depth in its own tree), -2 where
    the path has no node; the same as path_tokens without nonzero (no shape depends on data).
    `below_only`: leave depth 0 (the subtree's own root) out."""
    at = (attn.depth + offset)[None, :] == torch.arange(width, device=tokens.device)[:, None]  # [width, n]
    if below_only:
        at = at & (attn.depth > 0)[None, :]
    hit = attn.ancestors[:, None, :] & at[None]  # [n, width, n]: ancestor k of i sits at column j
    picked = (hit.long() * tokens[None, None, :]).sum(-1)  # at most one ancestor per depth
    return torch.where(hit.any(-1), picked, torch.full_like(picked, -2))


def graft_static(draft: DraftTree, anchor: int, tokens: Tensor, parents: Tensor, room) -> GraftResult:
    """graft() with shapes fixed by the inputs alone: the result has draft.num_nodes + m - 1 nodes, the
    slots no retrieved node took being empty (token -1, source EMPTY, parent 0), and `added` / `merged`
    are 0-d tensors. `room` may be a 0-d tensor. Empty draft slots (token -1) never merge with anything.
    Nothing is read back to the host, so on a GPU the step keeps its one sync (the accepted path)."""
    device = draft.tokens.device
    n, m = draft.num_nodes, tokens.shape[0]
    width = n + m  # a bound on every path's length: no host read of a depth
    d_attn = topology(draft.parents, 0)
    r_attn = topology(parents, 0)
    d_paths = dense_paths(draft.tokens, d_attn, width)  # [n, width]
    anchor_depth = d_attn.depth[anchor]  # 0-d tensor
    columns = torch.arange(width, device=device)
    below = dense_paths(tokens, r_attn, width, offset=anchor_depth, below_only=True)  # [m, width]
    r_paths = torch.where(columns[None, :] <= anchor_depth, d_paths[anchor][None, :], below)
    r_paths[0] = d_paths[anchor]

    placed = place_retrieved(draft, anchor, tokens, r_attn, r_paths, d_paths, room)
    keep, rank, place = placed.keep, placed.rank, placed.place
    slots = m - 1  # one slot per retrieved node below the anchor, plus a spare one for the rest to land on
    slot = torch.where(keep, rank - 1, torch.full_like(rank, slots))
    new_tokens = torch.full((slots + 1,), -1, dtype=torch.long, device=device).scatter(0, slot, tokens)
    new_parents = torch.zeros(slots + 1, dtype=torch.long, device=device).scatter(
        0, slot, torch.where(keep, place[parents.clamp_min(0)], 0)
    )
    filled = torch.zeros(slots + 1, dtype=torch.bool, device=device).scatter(0, slot, keep)[:slots]
    new_tokens = torch.where(filled, new_tokens[:slots], -1)
    new_parents = torch.where(filled, new_parents[:slots], 0)
    sources = draft.node_sources().to(torch.int8)
    scores = draft.scores if draft.scores is not None else torch.zeros(n, device=device)
    tree = DraftTree(
        tokens=torch.cat([draft.tokens, new_tokens]),
        parents=torch.cat([draft.parents, new_parents]),
        scores=torch.cat([scores, torch.full((slots,), float("-inf"), device=device)]),
        sources=torch.cat(
            [sources, torch.where(filled, int(NodeSource.RETRIEVAL), int(NodeSource.EMPTY)).to(torch.int8)]
        ),
    )
    return GraftResult(tree, keep.sum(), placed.merged_count)


def compact(tree: DraftTree, size: int) -> DraftTree:
    """The tree's filled nodes first (in their order, so parents still precede children), then empty
    slots (token -1, parent 0), cut to `size` nodes: a fixed-size tree from one with empty slots anywhere.
    The caller guarantees at most `size` filled nodes."""
    filled = tree.tokens >= 0
    order = torch.sort((~filled).to(torch.int8), stable=True).indices  # filled first
    new_index = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=order.device))
    parents = torch.where(tree.parents >= 0, new_index[tree.parents.clamp_min(0)], -1)
    parents = torch.where(filled, parents, 0)
    parents[0] = -1
    cut = lambda t: None if t is None else t[order][:size]  # noqa: E731
    return DraftTree(tree.tokens[order][:size], parents[order][:size], cut(tree.scores), cut(tree.sources))


class Grafted:
    """A tree as retrieved subtrees are grafted onto it one after another, within `room` new nodes.

    `static`: fixed shapes (graft_static): room, added and merged are 0-d tensors, the tree keeps empty
    slots, and finish(size) compacts it to the step's budget."""

    def __init__(self, tree: DraftTree, room, static: bool = False):
        self.tree, self.room, self.added, self.merged = tree, room, 0, 0
        self.static = static

    def finish(self, size: int) -> DraftTree:
        return compact(self.tree, size) if self.static else self.tree

    def attach(
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
        the new nodes are marked (host path; the static one grafts retrieval only)."""
        if self.static:
            room = self.room if room is None else torch.clamp(self.room, max=room)
            result = graft_static(self.tree, anchor, tokens, parents, room)
            self.tree = result.tree
            self.room = self.room - result.added
            self.added = self.added + result.added
            self.merged = self.merged + result.merged
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
