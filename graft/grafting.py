"""Grafting: unite a draft tree with a retrieved subtree that hangs from one of its nodes, within a budget.

The retrieved subtree's node 0 is the *anchor*, an existing draft node (the root for Graft's paper form).
A retrieved node whose whole path from the root spells the same tokens as a draft node's path is that
draft node (merged, same token under the same parent), so it costs nothing; the slots that merges and
unknown entries (-1) free go to the next retrieved nodes in the subtree's order. Retrieved nodes are
offered in the subtree's order (parents first), so any prefix of the new nodes is ancestor-closed.

Everything is tensor code over paths: no Python loop over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from graft.tree import DraftTree, NodeSource, topology


@dataclass
class GraftResult:
    tree: DraftTree
    added: int  # retrieved nodes added to the tree
    merged: int  # retrieved nodes that the draft already held


def path_tokens(tokens: Tensor, parents: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """[n, width] token at each depth along each node's root path (-2 past its depth), and depths [n]."""
    attn = topology(parents, 0)
    n = tokens.shape[0]
    paths = torch.full((n, width), -2, dtype=torch.long, device=tokens.device)
    row, node = torch.nonzero(attn.ancestors, as_tuple=True)
    keep = attn.depth[node] < width
    paths[row[keep], attn.depth[node][keep]] = tokens[node[keep]]
    return paths, attn.depth


def graft(draft: DraftTree, anchor: int, tokens: Tensor, parents: Tensor, room: int) -> GraftResult:
    """Add up to `room` nodes of the retrieved subtree (tokens [m], parents [m], node 0 = the anchor's token)
    under draft node `anchor`. Unknown retrieved tokens (-1) and their descendants are skipped."""
    device = draft.tokens.device
    n, m = draft.num_nodes, tokens.shape[0]
    if m <= 1 or room <= 0:
        return GraftResult(draft, 0, 0)
    r_attn = topology(parents, 0)
    d_paths, d_depth = path_tokens(draft.tokens, draft.parents, n)  # [n, n]
    anchor_depth = int(d_depth[anchor])
    width = max(n, anchor_depth + int(r_attn.depth.max()) + 1)  # every path fits, so equal rows mean equal paths
    d_paths = torch.nn.functional.pad(d_paths, (0, width - n), value=-2)
    # retrieved node i's path from the draft root: the anchor's path, then the subtree's tokens below it
    r_paths = torch.full((m, width), -2, dtype=torch.long, device=device)
    r_paths[:, : anchor_depth + 1] = d_paths[anchor, : anchor_depth + 1]
    row, node = torch.nonzero(r_attn.ancestors, as_tuple=True)
    below = r_attn.depth[node] > 0
    r_paths[row[below], anchor_depth + r_attn.depth[node][below]] = tokens[node[below]]

    same = (r_paths[:, None, :] == d_paths[None, :, :]).all(-1)  # [m, n]
    merged = same.any(1)  # [m]
    merged_to = same.float().argmax(1)  # [m] draft index where merged
    unknown = (r_attn.ancestors & (tokens < 0)[None, :]).any(1)  # [m] this node or an ancestor is unknown
    new = ~merged & ~unknown
    new[0] = False
    rank = torch.cumsum(new.long(), 0)  # [m] 1-based rank among new nodes
    keep = new & (rank <= room)
    new_id = n + rank - 1  # index in the grafted tree, for kept nodes
    place = torch.where(merged, merged_to, new_id)  # [m] grafted-tree index of every node that exists
    place[0] = anchor
    kept = torch.nonzero(keep).squeeze(1)  # [added], in subtree order
    added = kept.shape[0]
    sources = (
        draft.sources
        if draft.sources is not None
        else torch.full((n,), int(NodeSource.DRAFT), dtype=torch.int8, device=device)
    )
    scores = draft.scores if draft.scores is not None else torch.zeros(n, device=device)
    tree = DraftTree(
        tokens=torch.cat([draft.tokens, tokens[kept]]),
        parents=torch.cat([draft.parents, place[parents[kept]]]),
        scores=torch.cat([scores, torch.full((added,), float("-inf"), device=device)]),
        sources=torch.cat([sources, torch.full((added,), int(NodeSource.RETRIEVAL), dtype=torch.int8, device=device)]),
    )
    return GraftResult(tree, added, int((merged[1:] & ~unknown[1:]).sum()))


class Grafted:
    """A tree as retrieved subtrees are grafted onto it one after another, within `room` new nodes."""

    def __init__(self, tree: DraftTree, room: int):
        self.tree, self.room, self.added, self.merged = tree, room, 0, 0

    def attach(
        self, anchor: int, tokens: Tensor, parents: Tensor, room: int | None = None, chain: bool = False
    ) -> None:
        """Graft the subtree (tokens [m], parents [m], node 0 = the anchor's token) under node `anchor`.
        `chain`: a chain of known tokens, which on a bare root needs no merging."""
        room = self.room if room is None else min(room, self.room)
        if chain and self.tree.num_nodes == 1 and room > 0 and tokens.shape[0] > 1:
            kept = tokens[1 : room + 1]
            parents = torch.arange(-1, kept.shape[0], device=tokens.device)
            result = GraftResult(
                DraftTree.build(torch.cat([self.tree.tokens, kept]), parents, NodeSource.RETRIEVAL), kept.shape[0], 0
            )
        else:
            result = graft(self.tree, anchor, tokens, parents, room)
        self.tree = result.tree
        self.room -= result.added
        self.added += result.added
        self.merged += result.merged
