"""Token Recycling: a table of each token's likely successors, refreshed from every verification, read out
through a static rank template rooted at a given token.

- The table M [vocab, k] holds, for each token, the target's top-k next tokens the last time that token was
  verified (-1 where nothing is known yet). After each verification every verified node writes its row from
  its own logits, accepted or rejected. A token at several nodes: the node on the accepted path wins (its
  context is the one that was committed), otherwise the node verified last (highest index).
- A template is a static tree of (parent, rank) pairs: node i's token is M[token of parent i][rank i]. It is
  built best-first from a prior on how often each rank is right, so the rank-0 chain runs deepest and lower
  ranks get fewer descendants; any prefix of it is a template for a smaller budget (ancestor-closed).
- Reading a template costs one gather per template depth, whatever the table holds.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
from torch import Tensor

# How often the target's rank-r successor is the next token, as a prior for shaping templates. Rough
# shape of rank-acceptance curves reported for Token Recycling and Medusa-style trees; only the order of
# template nodes depends on it, never correctness.
DEFAULT_RANK_PRIOR = (0.40, 0.14, 0.07, 0.045, 0.03, 0.022, 0.017, 0.013)


class SuccessorTable:
    def __init__(self, vocab_size: int, k: int = 8, device: torch.device | str = "cpu"):
        self.k = k
        self.rows = torch.full((vocab_size, k), -1, dtype=torch.long, device=device)  # [vocab, k]

    def clear(self) -> None:
        self.rows.fill_(-1)

    def seed_bigrams(self, tokens: Tensor) -> None:
        """Cold start from text: where a row is still empty, rank 0 becomes the token that followed it (latest wins)."""
        if tokens.shape[0] < 2:
            return
        prev, nxt = tokens[:-1], tokens[1:]
        prev, nxt = _last_per_key(prev, nxt, torch.arange(prev.shape[0], device=prev.device))
        empty = self.rows[prev, 0] < 0
        self.rows[prev[empty], 0] = nxt[empty]

    def update(self, tokens: Tensor, logits: Tensor, on_path: Tensor) -> None:
        """tokens [n] verified node tokens, logits [n, vocab] the target's logits at them, on_path [n] bool."""
        n = tokens.shape[0]
        successors = logits.topk(self.k, dim=-1).indices  # [n, k]
        priority = torch.arange(n, device=tokens.device) + on_path.long() * n  # [n]
        keys, rows = _last_per_key(tokens, successors, priority)
        self.rows[keys] = rows


def _last_per_key(keys: Tensor, values: Tensor, priority: Tensor) -> tuple[Tensor, Tensor]:
    """For each distinct key, the value with the highest priority (priorities distinct) -> (keys, values)."""
    order = torch.sort(priority, stable=True).indices
    order = order[torch.sort(keys[order], stable=True).indices]  # by key, then by priority
    sorted_keys = keys[order]
    last = torch.ones_like(sorted_keys, dtype=torch.bool)
    last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    return sorted_keys[last], values[order[last]]


@dataclass(frozen=True)
class Template:
    """A static retrieval tree: node 0 is the anchor (an existing token); parents[i] < i; ranks[0] unused."""

    parents: Tensor  # [n] int64
    ranks: Tensor  # [n] int64
    levels: tuple[Tensor, ...]  # node indices at depth 1, 2, ... (for one gather per depth)

    @property
    def size(self) -> int:
        return self.parents.shape[0]

    def prefix(self, n: int) -> "Template":
        return make_template(self.parents[:n].tolist(), self.ranks[:n].tolist(), self.parents.device)


def make_template(parents: list[int], ranks: list[int], device="cpu") -> Template:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    levels = tuple(
        torch.tensor([i for i, d in enumerate(depth) if d == level], dtype=torch.long, device=device)
        for level in range(1, max(depth, default=0) + 1)
    )
    return Template(torch.tensor(parents, dtype=torch.long, device=device), torch.tensor(ranks, dtype=torch.long, device=device), levels)


def build_template(size: int, k: int = 8, max_depth: int = 8, rank_prior=DEFAULT_RANK_PRIOR, device="cpu") -> Template:
    """Best-first static template of `size` nodes (anchor included): a node's value is the product of its
    ranks' priors along the path; children are offered in rank order, so parents always come first."""
    prior = list(rank_prior)[:k]
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
            sibling = value / prior[rank] * prior[rank + 1]
            heapq.heappush(heap, (-sibling, counter, parent, rank + 1))
            counter += 1
        if depth[node] < max_depth:  # the first child
            heapq.heappush(heap, (-(value * prior[0]), counter, node, 0))
            counter += 1
    return make_template(parents, ranks, device)


def read_template(table: SuccessorTable, template: Template, anchor_token: int | Tensor) -> Tensor:
    """Tokens of the template rooted at `anchor_token` -> [n]; -1 where the table has no entry (or the parent has none)."""
    tokens = torch.full((template.size,), -1, dtype=torch.long, device=table.rows.device)
    tokens[0] = anchor_token
    for level in template.levels:  # one gather per depth
        parent_tokens = tokens[template.parents[level]]
        found = table.rows[parent_tokens.clamp(min=0), template.ranks[level]]
        tokens[level] = torch.where(parent_tokens >= 0, found, -1)
    return tokens


def chain_template(length: int, device="cpu") -> Template:
    """The rank-0 chain: anchor -> its best successor -> that one's best successor ... (`length` nodes after the anchor)."""
    return make_template(list(range(-1, length)), [0] * (length + 1), device)


class Recycler:
    """The table plus templates of every size it is asked for (built once, then reused)."""

    def __init__(self, vocab_size: int, k: int = 8, max_depth: int = 8, rank_prior=DEFAULT_RANK_PRIOR, device="cpu"):
        self.table = SuccessorTable(vocab_size, k, device)
        self.max_depth, self.rank_prior, self.device = max_depth, tuple(rank_prior), device
        self._templates: dict[tuple[str, int], Template] = {}

    def template(self, size: int, shape: str = "tree") -> Template:
        key = (shape, size)
        if key not in self._templates:
            if shape == "chain":
                self._templates[key] = chain_template(size - 1, self.device)
            else:
                self._templates[key] = build_template(size, self.table.k, self.max_depth, self.rank_prior, self.device)
        return self._templates[key]

    def reset(self, prompt: list[int], last_logits: Tensor | None = None) -> None:
        """A fresh table per sequence: bigrams of the prompt, then the target's top-k after the last prompt token."""
        prompt_tokens = torch.tensor(prompt, dtype=torch.long, device=self.table.rows.device)
        self.table.clear()
        self.table.seed_bigrams(prompt_tokens)
        if last_logits is not None:
            self.table.update(prompt_tokens[-1:], last_logits[-1:], torch.ones(1, dtype=torch.bool, device=prompt_tokens.device))

    def subtree(self, anchor_token, size: int, shape: str = "tree") -> tuple[Tensor, Tensor]:
        """(tokens [size], parents [size]) of the template read at `anchor_token`."""
        template = self.template(size, shape)
        return read_template(self.table, template, anchor_token), template.parents

    def observe(self, tokens: Tensor, logits: Tensor, path_index) -> None:
        on_path = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        on_path[path_index] = True
        self.table.update(tokens, logits, on_path)
