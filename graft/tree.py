"""Draft trees, their topology (what the target needs to verify them), and rank trees (static shapes).

A draft tree is stored flat, in topological order: node 0 is the *root*, the last committed token (its
key/value is not in the target's cache yet), and every other node's parent has a smaller index. Verifying
the tree is one target forward over all nodes, where node i may attend to the committed context and to
its own ancestors (itself included) and to nothing else.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from graft.ops import upload


class NodeSource(IntEnum):
    """Where a node came from, recorded per node so acceptance can be attributed to a source."""

    ROOT = 0
    DRAFT = 1  # a model drafter (EAGLE head, block drafter)
    RETRIEVAL = 2  # a lookup structure (prompt lookup, token recycling, suffix automaton)
    TEST = 3  # injected by tests
    EMPTY = 4  # a slot of a fixed-size tree that holds no token (token -1; graft/fixed_size.py: graft_fixed)


@dataclass
class DraftTree:
    tokens: Tensor  # [num_nodes] int64; tokens[0] is the root token; -1: an empty slot (static trees)
    parents: Tensor  # [num_nodes] int64; parents[0] == -1, parents[i] < i
    scores: Tensor | None = None  # [num_nodes] float, drafter's own score (e.g. cumulative log-prob)
    sources: Tensor | None = None  # [num_nodes] int8, NodeSource values

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    @staticmethod
    def build(tokens: Tensor, parents: Tensor, source: NodeSource, scores: Tensor | None = None) -> "DraftTree":
        """A tree whose nodes all come from `source`, node 0 marked as the root."""
        sources = torch.full(tokens.shape, int(source), dtype=torch.int8, device=tokens.device)
        sources[0] = NodeSource.ROOT
        return DraftTree(tokens=tokens, parents=parents, scores=scores, sources=sources)

    @staticmethod
    def root_only(token: int | Tensor, device: torch.device | str = "cpu") -> "DraftTree":
        """The root alone; a token already on the device ([1]) is used as it is (no copy up)."""
        tokens = token.view(1) if isinstance(token, Tensor) else upload([token], device)
        return DraftTree.build(tokens, torch.full((1,), -1, dtype=torch.long, device=device), NodeSource.ROOT)

    @staticmethod
    def chain(root: int, continuation: list[int], source: NodeSource, device="cpu") -> "DraftTree":
        """A linear tree: root -> continuation[0] -> continuation[1] -> ..."""
        n = 1 + len(continuation)
        tokens = upload([root, *continuation], device)
        return DraftTree.build(tokens, torch.arange(-1, n - 1, dtype=torch.long, device=device), source)

    def first(self, count: int) -> "DraftTree":
        """The first `count` nodes: a tree again, since every parent precedes its children."""
        if count >= self.num_nodes:
            return self
        cut = lambda t: None if t is None else t[:count]  # noqa: E731
        return DraftTree(self.tokens[:count], self.parents[:count], cut(self.scores), cut(self.sources))

    def node_sources(self) -> Tensor:
        """[num_nodes] int64 sources (DRAFT where the drafter recorded none), the root marked ROOT."""
        src = self.sources.long() if self.sources is not None else torch.full_like(self.tokens, int(NodeSource.DRAFT))
        src[0] = int(NodeSource.ROOT)
        return src

    def validate(self) -> None:
        """Raise ValueError when the tree is not a topologically ordered tree rooted at node 0."""
        n = self.num_nodes
        if self.tokens.ndim != 1 or self.parents.shape != self.tokens.shape:
            raise ValueError(
                f"tokens {tuple(self.tokens.shape)} and parents {tuple(self.parents.shape)} must be equal 1-D"
            )
        if n == 0 or int(self.parents[0]) != -1:
            raise ValueError("node 0 must be the root, with parent -1")
        if n > 1:
            own = torch.arange(1, n, device=self.parents.device)
            rest = self.parents[1:]
            if bool(((rest < 0) | (rest >= own)).any()):
                raise ValueError(f"parents must satisfy 0 <= parents[i] < i; got {self.parents.tolist()}")
        for name in ("scores", "sources"):
            value = getattr(self, name)
            if value is not None and value.shape != self.tokens.shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(self.tokens.shape)}")


def prefix_causal(n: int, start: int, device: torch.device | str = "cpu") -> Tensor:
    """bool [n, start + n]: n new positions after `start` cached ones see every cached position and are
    causal among themselves (a prompt chunk, a draft head's extend)."""
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)


def prefix_tree_masks(starts: Tensor, block: Tensor, longest: int, dtype: torch.dtype) -> Tensor:
    """Several sequences' new entries at once -> additive [sequences, n, longest + T] in `dtype`: sequence a's entry i
    sees its starts[a] committed positions and, after them, the new entries block[a, i] [T] says (a tree's
    ancestors, a draft's levels so far); the columns past starts[a] + T are never read."""
    rows, n, width = block.shape
    column = torch.arange(longest + width, device=starts.device) - starts[:, None]  # [sequences, columns]
    seen = block.gather(2, column.clamp(0, width - 1)[:, None, :].expand(rows, n, -1))
    allowed = seen | (column < 0)[:, None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=starts.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool [n, S] (True = may attend) -> additive [1, 1, n, S] in `dtype` (0 or the dtype's minimum)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


@dataclass
class Topology:
    """The tree's shape placed after `cache_len` committed positions: ancestors, depths, positions."""

    ancestors: Tensor  # [num_nodes, num_nodes] bool; ancestors[i, j]: j is i or an ancestor of i
    depth: Tensor  # [num_nodes] int64; root has depth 0
    cache_len: int

    @property
    def num_nodes(self) -> int:
        return self.depth.shape[0]

    def attention_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """[1, 1, num_nodes, cache_len + num_nodes] additive mask: 0 where attention is allowed."""
        n = self.num_nodes
        allowed = torch.ones(n, self.cache_len + n, dtype=torch.bool, device=self.depth.device)
        allowed[:, self.cache_len :] = self.ancestors
        return additive_mask(allowed, dtype)

    def tree_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """[1, 1, num_nodes, num_nodes] additive: the tree's own block of attention_mask, for an attention that
        lets every node see the committed prefix without a mask (graft/layers.py: split_attention)."""
        return additive_mask(self.ancestors, dtype)

    def position_ids(self) -> Tensor:
        """[1, num_nodes] absolute positions: a node sits at cache_len + its depth."""
        return (self.depth + self.cache_len).unsqueeze(0)

    @cached_property
    def paths(self) -> Tensor:
        """[num_leaves, max_depth + 1] root-to-leaf node indices, padded with -1, leaves in index order."""
        is_parent = self.ancestors.sum(0) > 1  # a node is an ancestor of someone other than itself
        leaves = torch.nonzero(~is_parent).squeeze(1)  # [num_leaves]  # sync ok: tests and analysis, not a step
        max_depth = int(self.depth.max())
        paths = torch.full((leaves.shape[0], max_depth + 1), -1, dtype=torch.long, device=self.depth.device)
        leaf_row, node = torch.nonzero(self.ancestors[leaves], as_tuple=True)  # sync ok: as above
        paths[leaf_row, self.depth[node]] = node
        return paths


def topology(parents: Tensor, cache_len: int, host: bool = False) -> Topology:
    """Ancestor matrix and depths of a topologically ordered tree, without a Python loop over nodes.

    The ancestor relation is the transitive closure of "is my parent", computed by repeated squaring
    of a boolean matrix: ceil(log2(num_nodes)) small matrix products, a fixed count, so no host sync.
    `host` (a backend's `ops.on_host(parents)`): a small tree is walked in Python instead, which is cheaper
    than the squarings' tiny tensor ops on a CPU.
    """
    n = parents.shape[0]
    if host and 1 < n <= HOST_TOPOLOGY_NODES:
        return _topology_walk(parents.tolist(), cache_len)
    reach = torch.eye(n, dtype=torch.bool, device=parents.device)
    if n > 1:
        child = torch.arange(1, n, device=parents.device)
        reach[child, parents[1:]] = True
        closure = reach.to(torch.float32)
        for _ in range(max(1, math.ceil(math.log2(n)))):
            closure = ((closure @ closure) > 0).to(torch.float32)
        reach = closure > 0
    depth = reach.sum(1) - 1
    return Topology(ancestors=reach, depth=depth, cache_len=cache_len)


# up to this many nodes a CPU tree's ancestors are one walk over Python ints used as bit sets (cheaper than the
# squarings' dozen tiny tensor ops); beyond, 64-bit rows would not hold them
HOST_TOPOLOGY_NODES = 62


def _topology_walk(parents: list[int], cache_len: int) -> Topology:
    """topology() for a topologically ordered tree on the host: node i's ancestor set is its parent's plus i."""
    sets, depth = _ancestor_sets(parents)
    bits = torch.tensor(sets)[:, None] >> torch.arange(len(parents))[None, :]  # [n, n]: bit j of node i's set
    return Topology(ancestors=(bits & 1).bool(), depth=torch.tensor(depth), cache_len=cache_len)


def _ancestor_sets(parents: list[int]) -> tuple[list[int], list[int]]:
    """Each node's ancestors (itself included) as a bit set, and its depth."""
    if any(not 0 <= p < i for i, p in enumerate(parents[1:], start=1)):
        raise ValueError(f"parents {parents}: each node's parent must come before it (parents[i] < i)")
    sets, depth = [1], [0]
    for i in range(1, len(parents)):
        sets.append(sets[parents[i]] | (1 << i))
        depth.append(depth[parents[i]] + 1)
    return sets, depth


@dataclass
class TreeRows:
    """Several host trees' topologies at once (a batch's step): every node's ancestor bits and depth, the trees'
    nodes one after the other, so the batch builds its masks and positions in one pass (graft/backends/target.py:
    tree_segments); each tree's Topology cuts its own from them when read."""

    ancestors: Tensor  # [nodes, widest] bool: row offsets[b] + i, column j: node j of tree b is i or i's ancestor
    depth: Tensor  # [nodes]
    offsets: list[int]  # [trees + 1]: tree b's nodes are rows offsets[b] .. offsets[b + 1]
    cache_lens: list[int]

    @property
    def sizes(self) -> list[int]:
        return [hi - lo for lo, hi in zip(self.offsets, self.offsets[1:])]

    def topologies(self) -> list[Topology]:
        return [_TopologyInRows(self, b) for b in range(len(self.cache_lens))]


class _TopologyInRows(Topology):
    """Tree b's Topology within TreeRows: its tensors cut from the batch's when first read."""

    def __init__(self, rows: TreeRows, b: int):
        self._rows, self._b, self.cache_len = rows, b, rows.cache_lens[b]

    @cached_property
    def ancestors(self) -> Tensor:
        lo, hi = self._rows.offsets[self._b], self._rows.offsets[self._b + 1]
        return self._rows.ancestors[lo:hi, : hi - lo]

    @cached_property
    def depth(self) -> Tensor:
        return self._rows.depth[self._rows.offsets[self._b] : self._rows.offsets[self._b + 1]]


def tree_rows(parents: list[Tensor], cache_lens: list[int]) -> TreeRows | None:
    """Host trees' topologies together: one read of every tree's parents, a walk per tree, one tensor of every
    node's ancestors. None where a tree is too big for the walk (topology() squares its matrix instead)."""
    if any(p.shape[0] > HOST_TOPOLOGY_NODES for p in parents):
        return None
    every = torch.cat(parents).tolist() if len(parents) > 1 else parents[0].tolist()
    sets, depth, offsets = [], [], [0]
    for n in (p.shape[0] for p in parents):
        lo = offsets[-1]
        tree_sets, tree_depth = _ancestor_sets(every[lo : lo + n])
        sets += tree_sets
        depth += tree_depth
        offsets.append(lo + n)
    widest = max(offsets[i + 1] - offsets[i] for i in range(len(parents)))
    bits = torch.tensor(sets)[:, None] >> torch.arange(widest)[None, :]
    return TreeRows((bits & 1).bool(), torch.tensor(depth), offsets, list(cache_lens))


@dataclass(frozen=True)
class RankTree:
    """A static tree of ranks: node i takes the rank-`ranks[i]` choice after its parent's token. Used for
    EAGLE-1's static draft tree (ranks of the head's top-k) and Token Recycling's templates (ranks of the
    successor table). Node 0 is the anchor; nodes are in topological order."""

    parents: Tensor  # [n] int64, parents[0] = -1
    ranks: Tensor  # [n] int64, ranks[0] unused (0)
    depth: Tensor  # [n] int64

    @property
    def size(self) -> int:
        return self.parents.shape[0]

    @cached_property
    def levels(self) -> tuple[Tensor, ...]:
        """Per depth 1, 2, ...: the nodes at that depth (one gather or head call per depth)."""
        depths = range(1, int(self.depth.max()) + 1)
        return tuple(torch.nonzero(self.depth == d).squeeze(1) for d in depths)  # sync ok: once, a template's shape

    @cached_property
    def ancestors(self) -> Tensor:
        return topology(self.parents, 0).ancestors  # [n, n]

    @staticmethod
    def make(parents: list[int], ranks: list[int], device="cpu") -> "RankTree":
        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        return RankTree(as_tensor(parents), as_tensor(ranks), as_tensor(depth))

    @staticmethod
    def from_paths(paths: list[list[int]], device="cpu") -> "RankTree":
        """From rank paths below the anchor (EAGLE's `choices` format: [[0], [1], [0, 0], ...]), sorted by (depth, path)."""
        ordered = sorted((tuple(p) for p in paths), key=lambda p: (len(p), p))
        index = {(): 0}
        parents, ranks = [-1], [0]
        for path in ordered:
            index[path] = len(parents)
            parents.append(index[path[:-1]])
            ranks.append(path[-1])
        return RankTree.make(parents, ranks, device)

    @staticmethod
    def chain(length: int, device="cpu") -> "RankTree":
        """The rank-0 chain: `length` nodes after the anchor."""
        return RankTree.make(list(range(-1, length)), [0] * (length + 1), device)

    @staticmethod
    def best_first(size: int, rank_prior, max_depth: int, device="cpu") -> "RankTree":
        """`size` nodes (anchor included), best first: a node's value is the product of its ranks' priors
        along the path; children are offered in rank order, so parents always come first and any prefix
        is the best tree of that size."""
        prior = list(rank_prior)
        parents, ranks, depth = [-1], [0], [0]
        heap = [(-prior[0], 0, 0, 0)]  # (-value, order, parent, rank)
        counter = 1
        while heap and len(parents) < size:
            neg, _, parent, rank = heapq.heappop(heap)
            node = len(parents)
            parents.append(parent)
            ranks.append(rank)
            depth.append(depth[parent] + 1)
            value = -neg
            if rank + 1 < len(prior):  # the next sibling
                heapq.heappush(heap, (-(value / prior[rank] * prior[rank + 1]), counter, parent, rank + 1))
                counter += 1
            if depth[node] < max_depth:  # the first child
                heapq.heappush(heap, (-(value * prior[0]), counter, node, 0))
                counter += 1
        return RankTree.make(parents, ranks, device)


# Selecting a draft tree from scored candidates (EAGLE-2's expansion, DFlash's block): the host form; the
# fixed-size form is graft/fixed_size.py: select_fixed.


@dataclass
class Candidates:
    """Scored draft candidates of the EAGLE-2 expansion, in generation order (groups of top_k)."""

    tokens: list[Tensor]  # per group [top_k] target ids
    scores: list[Tensor]  # per group [top_k] cumulative log-probs
    group_parent: list[Tensor]  # per level: 1-based flat candidate index of each group's parent (0 = root)
    top_k: int
    levels: int  # expansion levels done after the root's children (0 .. depth)
    # a batch's expansion (graft/methods/eagle_tree.py: CandidateRows): every slot's candidates as [slots, ...]
    # tensors, this sequence's at `row`, so a batch selects every slot's tree at once
    rows: Any = None
    row: int = 0

    @property
    def count(self) -> int:
        return sum(t.shape[0] for t in self.tokens)


def best_k(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top k values and their indices, ties broken by index: a parent comes before a child of equal
    score (a child's log-prob can round to 0), so the kept set stays ancestor-closed."""
    order = torch.sort(values, descending=True, stable=True).indices[:k]
    return values[order], order


def parents_among(found: Candidates, chosen: Tensor) -> Tensor:
    """[c] each chosen candidate's parent as a node of the tree of the chosen ones (chosen [c]: flat
    candidate indices in candidate order, which is topological; node 0 is the root, node j + 1 chosen[j])."""
    parent_flat = torch.cat(found.group_parent)[chosen // found.top_k]  # 0 = root, else 1 + parent's flat index
    parent_pos = torch.searchsorted(chosen, parent_flat - 1) + 1
    return torch.where(parent_flat == 0, torch.zeros_like(parent_pos), parent_pos)


def select(found: Candidates, root: int | Tensor, keep: int) -> DraftTree:
    """The best `keep` candidates by cumulative log-probability, in candidate order (= topological order),
    as a tree under `root`; ancestor-closed because scores fall along a path."""
    all_scores = torch.cat(found.scores)  # [k + levels * k^2]
    all_tokens = torch.cat(found.tokens)
    device = all_scores.device
    keep = max(0, min(keep, all_scores.shape[0]))
    chosen = torch.sort(best_k(all_scores, keep)[1]).values
    parents = parents_among(found, chosen)
    root = root.view(1) if isinstance(root, Tensor) else upload([root], device)
    return DraftTree.build(
        torch.cat([root, all_tokens[chosen]]),
        torch.cat([torch.full((1,), -1, device=device), parents]),
        NodeSource.DRAFT,
        torch.cat([torch.zeros(1, device=device), all_scores[chosen]]),
    )
