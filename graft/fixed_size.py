"""The fixed-size path: trees whose shape does not depend on the data, so that a GPU step reads one thing back
to the host (the accepted path) and a compiled step replays one graph.

It runs when hardware.fixed_size_trees is on (the GPU default) and every part of a composed method
`supports_fixed_size` (graft/parts.py). A pruned draft then marks the nodes it drops empty (token -1,
NodeSource.EMPTY) instead of leaving them out; retrieval grafts into a fixed number of slots; the step's
figures stay on the device until the sequence ends. Each function here is the fixed-size form of a host one that
reads alone beside it:

- select_fixed: graft/tree.py select(), the best candidates as a tree;
- graft_fixed: graft/grafting.py graft(), a retrieved subtree grafted onto the draft;
- compact: the filled nodes first, cut to the step's budget (the host path never leaves empty slots);
- Deferred / deferred_in / resolve_deferred: a record's figure kept on the device, read back at the sequence's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from graft.tree import Candidates, DraftTree, NodeSource, best_k, parents_among, topology


@dataclass
class Deferred:
    """A figure of a step's note that stays on the device until the sequence ends (fixed-size trees), so
    that recording it costs no sync per step: value is a 0-d tensor; with `labels`, the figure is
    labels[value]. graft.decode reads every deferred figure of a sequence in one copy."""

    value: Tensor
    labels: tuple[str, ...] | None = None

    def resolve(self, host_value: float):
        return self.labels[int(host_value)] if self.labels is not None else host_value


def deferred_in(notes: list[dict]) -> tuple[list, Tensor | None]:
    """Every Deferred in `notes`: their places [(note, key)] and values [count] float64 on the device (None: none),
    to be read back with whatever else a sequence reads at its end and put back by resolve_deferred."""
    found = [(note, key) for note in notes for key, value in note.items() if isinstance(value, Deferred)]
    if not found:
        return [], None
    return found, torch.stack([note[key].value.reshape(()).double() for note, key in found])


def resolve_deferred(found: list, values: list[float]) -> None:
    """Each Deferred at `found` (deferred_in's places) replaced by its value read back (`values`)."""
    for (note, key), host in zip(found, values):
        deferred = note[key]
        note[key] = deferred.resolve(host if deferred.value.is_floating_point() else int(host))


def select_fixed(found: Candidates, root: Tensor, keep: Tensor, size: int, level_cap: Tensor | None) -> DraftTree:
    """graft/tree.py: select() with a fixed shape: the best `size` candidates (of levels <= level_cap), of which the best
    `keep` (a 0-d tensor) are filled and the rest are empty slots (token -1). Filled nodes are the ones
    select(found, root, keep) would keep, so the verified tokens match the pruned tree's; no host read."""
    all_scores = torch.cat(found.scores)  # [k + levels * k^2]
    all_tokens = torch.cat(found.tokens)
    device = all_scores.device
    if level_cap is not None:  # candidates of levels the host path would not have drafted
        level = torch.cat([torch.full_like(s, j, dtype=torch.long) for j, s in enumerate(found.scores)])
        all_scores = torch.where(level <= level_cap, all_scores, float("-inf"))
    size = min(size, all_scores.shape[0])
    best = best_k(all_scores, size)[1]  # best first
    chosen, rank = torch.sort(best)  # candidate order; rank[j]: chosen[j]'s place among the best
    filled = (rank < keep) & (all_scores[chosen] > float("-inf"))
    parents = torch.where(filled, parents_among(found, chosen), 0)
    minus = torch.full_like(chosen, -1)
    sources = torch.where(filled, int(NodeSource.DRAFT), int(NodeSource.EMPTY)).to(torch.int8)
    return DraftTree(
        tokens=torch.cat([root.view(1), torch.where(filled, all_tokens[chosen], minus)]),
        parents=torch.cat([minus[:1], parents]),
        scores=torch.cat([torch.zeros(1, device=device), torch.where(filled, all_scores[chosen], float("-inf"))]),
        sources=torch.cat([torch.zeros(1, dtype=torch.int8, device=device), sources]),
    )


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


class FixedGraft(NamedTuple):
    """graft_fixed's result: graft/grafting.py GraftResult with `added` and `merged` 0-d tensors on the device."""

    tree: DraftTree
    added: Tensor
    merged: Tensor


def graft_fixed(draft: DraftTree, anchor: int, tokens: Tensor, parents: Tensor, room) -> FixedGraft:
    """graft/grafting.py: graft() with shapes fixed by the inputs alone (the tree, then retrieved nodes added and
    merged): the result has draft.num_nodes + m - 1 nodes, the
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
    return FixedGraft(tree, keep.sum(), placed.merged_count)


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
