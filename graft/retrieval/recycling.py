"""Token Recycling: a table of each token's likely successors, refreshed from every verification, read out
through a static rank template rooted at a given token.

- The table M [vocab, k] holds, for each token, the target's top-k next tokens the last time that token was
  verified (-1 where nothing is known yet). After each verification every verified node writes its row from
  its own logits, accepted or rejected. A token at several nodes: the node on the accepted path wins (its
  context is the one that was committed), otherwise the node verified last (highest index).
- A template is a static rank tree (graft.tree.RankTree): node i's token is M[token of parent i][rank i]. It
  is built best-first from a prior on how often each rank is right, so the rank-0 chain runs deepest and
  lower ranks get fewer descendants; any prefix of it is a template for a smaller budget (ancestor-closed).
- Reading a template costs one gather per template depth, whatever the table holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from graft.acceptance import joined_rows
from graft.drafter import run_grouped
from graft.ops import PLAIN, Ops, ids_on, upload
from graft.tree import RankTree

# How often the target's rank-r successor is the next token, as a prior for shaping templates. Rough
# shape of rank-acceptance curves reported for Token Recycling and Medusa-style trees; only the order of
# template nodes depends on it, never correctness.
DEFAULT_RANK_PRIOR = (0.40, 0.14, 0.07, 0.045, 0.03, 0.022, 0.017, 0.013)


class SuccessorTable:
    def __init__(self, vocab_size: int, k: int = 8, device: torch.device | str = "cpu", ops: Ops = PLAIN):
        self.k, self.ops, self.vocab_size = k, ops, vocab_size
        # one spare row past the vocabulary takes the writes that must not land (losers, empty slots), so
        # that an update has no data-dependent shape; reads never reach it
        self._place(torch.full((1, vocab_size + 1, k), -1, dtype=torch.long, device=device), 0, [self])

    def _place(self, storage: Tensor, slot: int, group: list) -> None:
        """Hold slot `slot` of `storage` [slots, vocab + 1, k], shared with the tables of `group`."""
        self.storage, self.slot, self.group = storage, slot, group
        self._rows = storage[slot]
        self.rows = self._rows[: self.vocab_size]  # [vocab, k]

    def join(self, other: "SuccessorTable") -> None:
        """Take `other` (rows kept) into this table's storage as one more slot: a batch's tables in one tensor,
        read with one gather (read_templates) and taught with one scatter (update_tables) for every slot."""
        if other.group is self.group:
            return
        group, storage = self.group + [other], self.storage
        if len(group) > storage.shape[0]:  # full: twice the slots, so a batch's B joins copy O(B) slots in all
            storage = torch.full(
                (2 * storage.shape[0], *storage.shape[1:]), -1, dtype=storage.dtype, device=storage.device
            )
            storage[: len(self.group)] = self.storage[: len(self.group)]
        storage[len(group) - 1] = other._rows  # slots past the group's are never read
        for slot, table in enumerate(group):
            table._place(storage, slot, group)

    def clear(self) -> None:
        self.rows.fill_(-1)

    def seed_bigrams(self, tokens: Tensor) -> None:
        """Cold start from text: where a row is still empty, rank 0 becomes the token that followed it (latest wins)."""
        if tokens.shape[0] < 2:
            return
        prev, nxt = tokens[:-1], tokens[1:]
        spare = self.rows.shape[0]
        rows, nxt = _last_per_key(prev, nxt, torch.arange(prev.shape[0], device=prev.device), spare)
        empty = self._rows[rows, 0] < 0
        self._rows[torch.where(empty, rows, spare), 0] = nxt

    def seed_successors(self, tokens: Tensor, successors: Tensor) -> None:
        """Cold start from the prefill: row tokens[i] becomes successors[i] [k], the target's own top-k after
        prompt position i (where a token occurs more than once, its latest position wins)."""
        position = torch.arange(tokens.shape[0], device=tokens.device)  # the value kept and its priority
        rows, index = _last_per_key(tokens, position, position, self.rows.shape[0])
        self._rows[rows] = successors[index, : self.k]

    def update(self, tokens: Tensor, logits: Tensor, on_path: Tensor) -> None:
        """tokens [n] verified node tokens (-1: an empty slot, skipped), logits [n, vocab] the target's
        logits at them, on_path [n] bool. Shapes do not depend on the data (no sync on a GPU)."""
        n = tokens.shape[0]
        successors = self.ops.top_k_rows(logits, self.k)[1]  # [n, k]
        priority = torch.arange(n, device=tokens.device) + on_path.long() * n  # [n], distinct
        same_key = tokens[:, None] == tokens[None, :]  # [n, n]
        beaten = (same_key & (priority[None, :] > priority[:, None])).any(1)  # another node of the key wins
        writes = ~beaten & (tokens >= 0)
        self._rows[torch.where(writes, tokens, self.rows.shape[0])] = successors


def update_tables(
    tables: list[SuccessorTable], *, tokens: list[Tensor], logits: list[Tensor], paths: list[list[int]]
) -> None:
    """table.update for each table (tables of one storage: SuccessorTable.join; one table may come more than
    once, a shared table), in one scatter: tokens[b] [n_b] the nodes verified, logits[b] [n_b, vocab] theirs,
    paths[b] the accepted nodes. Where a token is written more than once, the later table's write wins, then
    an accepted node, then the later node: what the updates one after the other leave."""
    first = tables[0]
    storage, device = first.storage, first.storage.device
    per_slot = storage.shape[1]
    counts = [t.shape[0] for t in tokens]
    total = sum(counts)
    joined = joined_rows(logits)
    if joined is not None:  # a ragged forward's segments: one top-k over their rows, no copy
        successors = first.ops.top_k_rows(joined, first.k)[1]
    else:
        successors = torch.cat([first.ops.top_k_rows(block, first.k)[1] for block in logits])
    base, rank, on_path, start = [], [], [], 0
    for b, (table, n, path) in enumerate(zip(tables, counts, paths)):
        base += [table.slot * per_slot] * n
        rank += [b * 2 * total] * n  # a later table's writes beat an earlier one's
        on_path += [start + i for i in path]
        start += n
    node_tokens = torch.cat(tokens)  # [total]
    rows, ranks = upload(base, device), upload(rank, device)
    accepted = torch.zeros(total, dtype=torch.long, device=device).index_fill_(0, upload(on_path, device), total)
    priority = ranks + accepted + torch.arange(total, device=device)  # distinct
    spare = first.vocab_size  # the first slot's spare row: writes that must not land
    keys = torch.where(node_tokens >= 0, rows + node_tokens, spare)
    where, index = _last_per_key(keys, torch.arange(total, device=device), priority, spare)
    storage.view(-1, first.k)[where] = successors[index]


def _last_per_key(keys: Tensor, values: Tensor, priority: Tensor, spare: int) -> tuple[Tensor, Tensor]:
    """For each distinct key, the value with the highest priority (priorities distinct), at a fixed size (no
    data-dependent shape: no sync on a GPU) -> (rows [n], values [n]): each key's row once, every other entry's
    row `spare` (the table's scratch row, whose writes are dropped)."""
    order = torch.sort(priority, stable=True).indices
    order = order[torch.sort(keys[order], stable=True).indices]  # by key, then by priority
    sorted_keys = keys[order]
    last = torch.ones_like(sorted_keys, dtype=torch.bool)
    last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    return torch.where(last, sorted_keys, spare), values[order]


def read_template(table: SuccessorTable, template: RankTree, anchor_token: int | Tensor) -> Tensor:
    """Tokens of the template rooted at `anchor_token` -> [n]; -1 where the table has no entry (or the parent has none)."""
    tokens = torch.full((template.size,), -1, dtype=torch.long, device=table.rows.device)
    tokens[0] = anchor_token
    for level in template.levels:  # one gather per depth
        parent_tokens = tokens[template.parents[level]]
        found = table.rows[parent_tokens.clamp(min=0), template.ranks[level]]
        tokens[level] = torch.where(parent_tokens >= 0, found, -1)
    return tokens


def read_templates(tables: list[SuccessorTable], template: RankTree, *, anchors: Tensor) -> Tensor:
    """read_template for tables of one storage (SuccessorTable.join), each at its anchor (anchors [B]) -> [B, n],
    one gather per template depth for every table."""
    first = tables[0]
    per_slot, k = first.storage.shape[1:]
    flat = first.storage.view(-1, k)
    base = upload([t.slot * per_slot for t in tables], flat.device)[:, None]  # [B, 1]: each table's first row
    tokens = torch.full((len(tables), template.size), -1, dtype=torch.long, device=flat.device)
    tokens[:, 0] = anchors
    for level in template.levels:
        parent_tokens = tokens[:, template.parents[level]]  # [B, nodes at this depth]
        found = flat[base + parent_tokens.clamp(min=0), template.ranks[level]]
        tokens[:, level] = torch.where(parent_tokens >= 0, found, -1)
    return tokens


class Recycler:
    """The table plus templates of every size it is asked for (built once, then reused)."""

    def __init__(
        self, vocab_size: int, k: int = 8, max_depth: int = 8, rank_prior=DEFAULT_RANK_PRIOR, device="cpu", ops=PLAIN
    ):
        self.table = SuccessorTable(vocab_size, k, device, ops)
        self.max_depth, self.rank_prior, self.device = max_depth, tuple(rank_prior), device
        self.templates: dict[tuple[str, int], RankTree] = {}

    def template(self, size: int, shape: str = "tree") -> RankTree:
        key = (shape, size)
        if key not in self.templates:
            if shape == "chain":
                self.templates[key] = RankTree.chain(size - 1, self.device)
            else:
                self.templates[key] = RankTree.best_first(
                    size, self.rank_prior[: self.table.k], self.max_depth, self.device
                )
        return self.templates[key]

    def reset(
        self, prompt: list[int], last_logits: Tensor | None = None, successors: Tensor | None = None, clear: bool = True
    ) -> None:
        """A fresh table per sequence (`clear`; else the prompt is added to what the table holds). With `successors` (the prefill's top-k at every prompt position: the
        paper's cold start) every prompt token's row is the target's own prediction after it; without, the
        prompt's bigrams, then the target's top-k after the last prompt token."""
        prompt_tokens = upload(prompt, self.table.rows.device)
        if clear:
            self.table.clear()
        if successors is not None:
            self.table.seed_successors(prompt_tokens, successors)
            return
        self.table.seed_bigrams(prompt_tokens)
        if last_logits is not None:
            self.table.update(
                prompt_tokens[-1:], last_logits[-1:], torch.ones(1, dtype=torch.bool, device=prompt_tokens.device)
            )

    def subtree(self, anchor_token, size: int, shape: str = "tree") -> tuple[Tensor, Tensor]:
        """(tokens [size], parents [size]) of the template read at `anchor_token`."""
        template = self.template(size, shape)
        return read_template(self.table, template, anchor_token), template.parents

    def observe(self, tokens: Tensor, logits: Tensor, path_index) -> None:
        on_path = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        on_path[path_index] = True
        self.table.update(tokens, logits, on_path)


@dataclass
class TemplateRead:
    """Recycler.subtree as a call a drafter yields, so a batch reads every slot's template at once: one gather per
    template depth for the slots whose tables share one storage (SuccessorTable.join)."""

    recycler: Recycler
    anchor: int | Tensor  # the id, or one element on the device
    size: int
    shape: str = "tree"

    @torch.inference_mode()
    def run(self) -> tuple[Tensor, Tensor]:
        return self.recycler.subtree(self.anchor, self.size, self.shape)

    @staticmethod
    @torch.inference_mode()
    def run_all(calls: list["TemplateRead"]) -> list[tuple[Tensor, Tensor]]:
        """Each call's (tokens, parents): the largest template read for every slot of a storage (a smaller
        template is a prefix of a larger one: RankTree.best_first), then each cut to its own size."""
        key = lambda c: (id(c.recycler.table.storage), c.shape, c.recycler.rank_prior, c.recycler.max_depth)  # noqa: E731
        return run_grouped(calls, key, _read_group)


def _read_group(calls: list[TemplateRead]) -> list[tuple[Tensor, Tensor]]:
    if len(calls) == 1:
        return [calls[0].run()]
    first, shape = calls[0].recycler, calls[0].shape
    largest = first.template(max(c.size for c in calls), shape)
    anchors = ids_on([c.anchor for c in calls], first.device)
    tokens = read_templates([c.recycler.table for c in calls], largest, anchors=anchors)
    results = []
    for call, row in zip(calls, tokens.unbind(0)):
        template = first.template(call.size, shape)
        results.append((row if template.size == largest.size else row[: template.size], template.parents))
    return results


@dataclass
class TableUpdate:
    """Recycler.observe as a call a drafter yields after a verification, so a batch teaches every slot's table
    in one scatter (update_tables). Its result: this call's share of the seconds the update took."""

    recycler: Recycler
    tokens: Tensor  # [n] the verified nodes
    logits: Tensor  # [n, vocab] the target's logits at them
    path: list[int]  # the accepted nodes
    index: Tensor | list[int]  # the same on the device where acceptance left them there

    @torch.inference_mode()
    def run(self) -> float:
        started = time.perf_counter()
        self.recycler.observe(self.tokens, self.logits, self.index)
        return time.perf_counter() - started

    @staticmethod
    @torch.inference_mode()
    def run_all(calls: list["TableUpdate"]) -> list[float]:
        return run_grouped(calls, lambda c: (id(c.recycler.table.storage), c.recycler.table.k), _update_group)


def _update_group(calls: list[TableUpdate]) -> list[float]:
    """The group's updates in one update_tables; each call's share of its seconds."""
    if len(calls) == 1:
        return [calls[0].run()]
    started = time.perf_counter()
    update_tables(
        [c.recycler.table for c in calls],
        tokens=[c.tokens for c in calls],
        logits=[c.logits for c in calls],
        paths=[c.path for c in calls],
    )
    return [(time.perf_counter() - started) / len(calls)] * len(calls)
