"""Draft trees and the one function that turns parent indices into attention inputs.

A draft tree is stored flat, in topological order: node 0 is the *root*, the last committed token (its
key/value is not in the target's cache yet), and every other node's parent has a smaller index. Verifying
the tree is one target forward over all nodes, where node i may attend to the committed context and to
its own ancestors (itself included) and to nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property

import torch
from torch import Tensor


class NodeSource(IntEnum):
    """Where a node came from, recorded per node so acceptance can be attributed to a source."""

    ROOT = 0
    DRAFT = 1  # a model drafter (EAGLE head, block drafter)
    RETRIEVAL = 2  # a lookup structure (prompt lookup, token recycling, suffix automaton)
    TEST = 3  # injected by tests


@dataclass
class DraftTree:
    tokens: Tensor  # [num_nodes] int64; tokens[0] is the root token
    parents: Tensor  # [num_nodes] int64; parents[0] == -1, parents[i] < i
    scores: Tensor | None = None  # [num_nodes] float, drafter's own score (e.g. cumulative log-prob)
    sources: Tensor | None = None  # [num_nodes] int8, NodeSource values

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    @staticmethod
    def root_only(token: int, device: torch.device | str = "cpu") -> "DraftTree":
        return DraftTree(
            tokens=torch.tensor([token], dtype=torch.long, device=device),
            parents=torch.tensor([-1], dtype=torch.long, device=device),
            sources=torch.tensor([NodeSource.ROOT], dtype=torch.int8, device=device),
        )

    @staticmethod
    def chain(root: int, continuation: list[int], source: NodeSource, device="cpu") -> "DraftTree":
        """A linear tree: root -> continuation[0] -> continuation[1] -> ..."""
        n = 1 + len(continuation)
        sources = torch.full((n,), int(source), dtype=torch.int8, device=device)
        sources[0] = NodeSource.ROOT
        return DraftTree(
            tokens=torch.tensor([root, *continuation], dtype=torch.long, device=device),
            parents=torch.arange(-1, n - 1, dtype=torch.long, device=device),
            sources=sources,
        )

    def validate(self) -> None:
        """Raise ValueError when the tree is not a topologically ordered tree rooted at node 0."""
        n = self.num_nodes
        if self.tokens.ndim != 1 or self.parents.shape != self.tokens.shape:
            raise ValueError(f"tokens {tuple(self.tokens.shape)} and parents {tuple(self.parents.shape)} must be equal 1-D")
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


@dataclass
class TreeAttention:
    """Everything the target needs to verify a tree on top of `cache_len` committed positions."""

    ancestors: Tensor  # [num_nodes, num_nodes] bool; ancestors[i, j]: j is i or an ancestor of i
    depth: Tensor  # [num_nodes] int64; root has depth 0
    cache_len: int

    @property
    def num_nodes(self) -> int:
        return self.depth.shape[0]

    def attention_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """[1, 1, num_nodes, cache_len + num_nodes] additive mask: 0 where attention is allowed."""
        n = self.num_nodes
        mask = torch.zeros(1, 1, n, self.cache_len + n, dtype=dtype, device=self.depth.device)
        mask[0, 0, :, self.cache_len :].masked_fill_(~self.ancestors, torch.finfo(dtype).min)
        return mask

    def position_ids(self) -> Tensor:
        """[1, num_nodes] absolute positions: a node sits at cache_len + its depth."""
        return (self.depth + self.cache_len).unsqueeze(0)

    @cached_property
    def paths(self) -> Tensor:
        """[num_leaves, max_depth + 1] root-to-leaf node indices, padded with -1, leaves in index order."""
        is_parent = self.ancestors.sum(0) > 1  # a node is an ancestor of someone other than itself
        leaves = torch.nonzero(~is_parent).squeeze(1)  # [num_leaves]
        max_depth = int(self.depth.max())
        paths = torch.full((leaves.shape[0], max_depth + 1), -1, dtype=torch.long, device=self.depth.device)
        leaf_row, node = torch.nonzero(self.ancestors[leaves], as_tuple=True)
        paths[leaf_row, self.depth[node]] = node
        return paths


def tree_attention(parents: Tensor, cache_len: int) -> TreeAttention:
    """Ancestor matrix and depths of a topologically ordered tree, without a Python loop over nodes.

    The ancestor relation is the transitive closure of "is my parent", computed by repeated squaring
    of a boolean matrix: ceil(log2(num_nodes)) small matrix products, a fixed count, so no host sync.
    """
    n = parents.shape[0]
    reach = torch.eye(n, dtype=torch.bool, device=parents.device)
    if n > 1:
        child = torch.arange(1, n, device=parents.device)
        reach[child, parents[1:]] = True
        closure = reach.to(torch.float32)
        for _ in range(max(1, math.ceil(math.log2(n)))):
            closure = ((closure @ closure) > 0).to(torch.float32)
        reach = closure > 0
    depth = reach.sum(1) - 1
    return TreeAttention(ancestors=reach, depth=depth, cache_len=cache_len)
