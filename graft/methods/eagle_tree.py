"""An EAGLE head's forwards on its own cache, and the EAGLE-2/3 expansion of the dynamic tree.

A drafter asks for them as calls (ExpandCall: one sequence's whole expansion; SelectCall: its tree; ExtendCall:
what it committed, encoded), so a
batch (graft/batch.py) runs every slot's together: an expansion over [slots, top_k] tensors, one head forward
and one top-k per level for every expanding slot (expand_rows). Batch 1 runs the same code with one slot.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from graft.acceptance import joined_rows
from graft.draft_models.eagle.head import DraftHead
from graft.drafter import run_grouped
from graft.kv import KVBuffer
from graft.ops import ids_on, upload
from graft.tree import Candidates, DraftTree, NodeSource, additive_mask, prefix_causal, prefix_tree_masks, select

# positions the head encodes per forward when it extends over a long prompt: its masks and scores stay
# [EXTEND_CHUNK, context] instead of [prompt, prompt] (8K prompt tokens: 8 MiB of mask, not 256 MiB)
EXTEND_CHUNK = 1024

Checkpoint = Callable[[int, Tensor], bool]  # (levels done, frontier scores [top_k]) -> stop drafting here


def head_step(
    head: DraftHead,
    cache: KVBuffer,
    embeds: Tensor,
    hidden: Tensor,
    positions: Tensor,
    allowed: Tensor | None,
    compiled: bool = False,
) -> Tensor:
    """One head forward over n entries written after the cache's `length`; `allowed` [n, length + n] bool, or
    None for causal new entries that see the whole cache. Over a static cache (hardware.compile) the mask
    covers every slot, and with `compiled` (a drafting level: always [top_k] nodes) the compiled step runs."""
    n = embeds.shape[0]
    if not cache.static:
        if allowed is None and n > 1:
            allowed = prefix_causal(n, cache.length, embeds.device)
        mask = None if allowed is None else additive_mask(allowed, head.fc.weight.dtype)
        return head.step(embeds, hidden, positions, mask, cache)
    cache.reserve(cache.length + n)
    if allowed is None:
        allowed = prefix_causal(n, cache.length, embeds.device)
    allowed = torch.nn.functional.pad(allowed, (0, cache.capacity - allowed.shape[1]))  # unfilled slots hidden
    step = head.compiled_step if compiled and head.compiled_step is not None else head.step
    out = step(embeds, hidden, positions, additive_mask(allowed, head.fc.weight.dtype), cache)
    cache.advance(n)
    return out.clone() if step is not head.step else out  # a CUDA graph's output is overwritten by its next replay


def extend(head: DraftHead, cache: KVBuffer, embeds: Tensor, hidden: Tensor, chunk: int = EXTEND_CHUNK) -> Tensor:
    """Encode n new (embedding, feature) pairs after the cache's committed positions -> [n, H], at most
    `chunk` positions per forward."""
    outputs = []
    for lo in range(0, embeds.shape[0], chunk):
        part = slice(lo, lo + chunk)
        n, start = embeds[part].shape[0], cache.length
        positions = torch.arange(start, start + n, device=embeds.device)
        outputs.append(head_step(head, cache, embeds[part], hidden[part], positions, None))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


@dataclass
class ExtendCall:
    """After a verification, encode what one sequence committed (its tokens, paired with the target's features
    at the accepted nodes) on its head cache; the result is the head's output at the last one [H]. A batch runs
    every slot's as one head forward (run_all)."""

    head: DraftHead
    embed: Callable[[Tensor], Tensor]
    cache: KVBuffer
    tokens: list[int]  # committed: the accepted nodes' tokens, then the bonus token
    token_ids: Tensor | None  # the same on the device, where acceptance left them there
    features: Tensor  # [nodes, F] the target's features at every verified node
    path: list[int]  # the accepted nodes, whose features pair with `tokens`
    path_index: Tensor | None  # the same on the device

    @torch.inference_mode()
    def run(self) -> Tensor:
        ids = self.token_ids if self.token_ids is not None else upload(self.tokens, self.features.device)
        index = self.path_index if self.path_index is not None else self.path
        return extend(self.head, self.cache, self.embed(ids), self.features[index])[-1]

    @staticmethod
    @torch.inference_mode()
    def run_all(calls: list["ExtendCall"]) -> list[Tensor]:
        """Every call of one head as one forward over their rows (DraftHead.rows: causal segments, the fused
        target features projected once), where the head's engine has it; the others one by one."""
        return run_grouped(calls, lambda c: id(c.head), _extend_group)


def _extend_group(calls: list[ExtendCall]) -> list[Tensor]:
    head = calls[0].head
    if len(calls) == 1 or not head.runs_rows([c.cache for c in calls]):
        return [c.run() for c in calls]
    return list(_extend_rows(head, calls))


def _extend_rows(head: DraftHead, calls: list[ExtendCall]) -> tuple[Tensor, ...]:
    """ExtendCall.run of several slots as one head_rows forward: one upload of every committed token, one
    gather of their features (the forward's rows are one tensor: joined_rows), one of the outputs' last rows."""
    device, counts = calls[0].features.device, [len(c.tokens) for c in calls]
    ids = upload([t for c in calls for t in c.tokens], device)
    features = joined_rows([c.features for c in calls])
    if features is None:
        features = torch.cat([c.features[c.path] for c in calls])
    else:
        rows, first = [], 0
        for c in calls:
            rows += [first + i for i in c.path]
            first += c.features.shape[0]
        features = features.index_select(0, upload(rows, device))
    positions = upload([c.cache.length + j for c, n in zip(calls, counts) for j in range(n)], device)
    out = head.rows(calls[0].embed(ids), features, [c.cache for c in calls], positions, [None] * len(calls), counts)
    ends = upload(list(itertools.accumulate(counts)), device) - 1
    return out.index_select(0, ends).unbind(0)


@dataclass
class ExpandCall:
    """One sequence's EAGLE-2/3 expansion (expand's arguments), as a drafter asks for it: from the head's
    output `last` [H] at the last committed position, on the sequence's head cache. A batch runs every slot's
    as one expansion (run_all)."""

    head: DraftHead
    embed: Callable[[Tensor], Tensor]
    cache: KVBuffer
    last: Tensor  # [H]
    depth: int
    top_k: int
    checkpoint: Checkpoint | None = None
    levels: int | None = None

    def run(self) -> Candidates:
        return expand_rows([self])[0]

    @staticmethod
    def run_all(calls: list["ExpandCall"]) -> list[Candidates]:
        """Every call's expansion, those with one head, top_k and depth as one (expand_rows)."""
        return run_grouped(calls, lambda c: (id(c.head), c.top_k, c.depth), expand_rows)


class CandidateRows:
    """A batch's expansion, every slot's candidates together: per level (the slots that expanded it, their
    tokens [A, n], cumulative scores [A, n], and each group's parent [A, groups]; level 0: the root's children,
    every slot). `padded()` lays them out as [slots, ...] tensors, a slot's missing levels scored -inf."""

    def __init__(self, slots: int, top_k: int, levels: list):
        self.slots, self.top_k, self.levels = slots, top_k, levels
        self._padded: tuple[Tensor, Tensor, Tensor] | None = None

    def padded(self) -> tuple[Tensor, Tensor, Tensor]:
        """(tokens [slots, C], scores [slots, C], group parents [slots, 1 + levels * top_k]), candidates in the
        order each slot's own Candidates lists them."""
        if self._padded is None:
            tokens, scores, groups = [], [], []
            for active, ids, values, parents in self.levels:
                if parents is None:  # the root's children: one group, whose parent is the root
                    groups.append(torch.zeros(self.slots, 1, dtype=torch.long, device=ids.device))
                    tokens.append(ids)
                    scores.append(values)
                    continue
                tokens.append(self._every_slot(active, ids, 0))
                scores.append(self._every_slot(active, values, float("-inf")))
                groups.append(self._every_slot(active, parents, 0))
            self._padded = (torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(groups, 1))
        return self._padded

    def _every_slot(self, active: list[int], rows: Tensor, fill) -> Tensor:
        if len(active) == self.slots:
            return rows
        full = rows.new_full((self.slots, rows.shape[1]), fill)
        return full.index_copy_(0, upload(active, rows.device), rows)


def select_rows(found: list[Candidates], *, roots: list[int | Tensor], keeps: list[int]) -> list[DraftTree]:
    """select(found[b], roots[b], keeps[b]) for candidates of one batch's expansion (found[b].rows all the
    same), every slot's tree from one sort over [slots, candidates]: the trees `select` gives each alone (a
    slot's missing levels score -inf, after every real candidate, and keeps[b] <= its count)."""
    tokens, scores, groups = found[0].rows.padded()
    index = [f.row for f in found]
    if index != list(range(tokens.shape[0])):
        at = upload(index, tokens.device)
        tokens, scores, groups = tokens[at], scores[at], groups[at]
    device, width = tokens.device, tokens.shape[1]
    keeps = [max(0, min(keep, f.count)) for keep, f in zip(keeps, found)]
    most = max(keeps)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :most]
    ragged = min(keeps) < most
    if ragged:  # past a slot's own keep: a sentinel past every candidate, sorted last and cut below
        order = torch.where(torch.arange(most, device=device) < upload(keeps, device)[:, None], order, width)
    chosen = torch.sort(order, dim=-1).values  # [slots, most], candidate order (topological)
    picked = chosen.clamp(max=width - 1) if ragged else chosen
    parent_flat = groups.gather(1, picked // found[0].top_k)  # 0: the root, else 1 + the parent's candidate
    parent_node = torch.where(parent_flat == 0, 0, torch.searchsorted(chosen, parent_flat - 1) + 1)
    slots = len(found)
    trees = DraftTree(
        tokens=torch.cat([ids_on(roots, device)[:, None], tokens.gather(1, picked)], 1),
        parents=torch.cat([torch.full((slots, 1), -1, device=device), parent_node], 1),
        scores=torch.cat([torch.zeros(slots, 1, device=device), scores.gather(1, picked)], 1),
        sources=torch.full((slots, most + 1), int(NodeSource.DRAFT), dtype=torch.int8, device=device),
    )
    trees.sources[:, 0] = int(NodeSource.ROOT)
    fields = [_rows(t) for t in (trees.tokens, trees.parents, trees.scores, trees.sources)]
    return [DraftTree(*(f[b] for f in fields)).first(keeps[b] + 1) for b in range(slots)]


@dataclass
class SelectCall:
    """A drafter's select(found, root, keep): its best `keep` candidates as a tree under `root`. A batch selects
    the trees of one expansion's slots together (select_rows)."""

    found: Candidates
    root: int | Tensor  # the id, or [1] on the device
    keep: int

    def run(self) -> DraftTree:
        return select(self.found, self.root, self.keep)

    @staticmethod
    def run_all(calls: list["SelectCall"]) -> list[DraftTree]:
        """The calls of one batch's expansion (the same CandidateRows) as one select_rows; the others alone."""
        return run_grouped(calls, lambda c: id(c.found.rows) if c.found.rows is not None else id(c), _select_group)


@torch.inference_mode()
def _select_group(calls: list[SelectCall]) -> list[DraftTree]:
    if len(calls) == 1:
        return [calls[0].run()]
    return select_rows([c.found for c in calls], roots=[c.root for c in calls], keeps=[c.keep for c in calls])


def expand(head: DraftHead, embed, cache: KVBuffer, last: Tensor, depth: int, top_k: int, *args) -> Candidates:
    """One sequence's expansion (ExpandCall's fields, in order)."""
    return ExpandCall(head, embed, cache, last, depth, top_k, *args).run()


@torch.inference_mode()
def expand_rows(calls: list[ExpandCall]) -> list[Candidates]:
    """Score the root's top-k children from each call's `last`, then `depth` times expand every frontier node by
    its top-k children, keeping the global top-k by cumulative log-probability as the next frontier. A call's
    `checkpoint` may stop its expansion after any level; its `levels` stops it after that many (the checkpoint
    still runs), where the split says that deeper levels cannot change its tree (Split.levels_needed).

    The calls (one head, top_k and depth) expand together: each level is one head forward over every expanding
    slot's frontier [slots, k] and one top-k over its [slots * k] outputs, and the frontiers' bookkeeping runs on
    [slots, ...] tensors. A slot that stops leaves; the others go on. Each slot's candidates are the ones it gets
    alone (the head's rows do not mix: tests/core/test_batch_drafting.py)."""
    head, k, depth = calls[0].head, calls[0].top_k, calls[0].depth
    committed = [c.cache.length for c in calls]
    last = calls[0].last[None] if len(calls) == 1 else torch.stack([c.last for c in calls])  # [B, H]
    device = last.device
    top_values, top_indices, d2t = head.top_log_probs(last, k)  # [B, k]
    to_target = (lambda ids: ids + d2t[ids]) if d2t is not None else (lambda ids: ids)  # noqa: E731
    scores, frontier_tokens = top_values, to_target(top_indices)  # [A, k]: the active slots' frontiers
    root_group = torch.zeros(1, dtype=torch.long, device=device)
    batch = CandidateRows(len(calls), k, [(None, frontier_tokens, scores, None)])
    found = [
        Candidates([tokens], [values], [root_group], k, 0, batch if len(calls) > 1 else None, b)
        for b, (tokens, values) in enumerate(zip(_rows(frontier_tokens), _rows(scores)))
    ]
    frontier_hidden = last[:, None].expand(-1, k, -1)  # [A, k, H]
    frontier_flat = torch.arange(k, device=device).expand(len(calls), k)  # flat candidate index of each node
    eye = torch.eye(k, dtype=torch.bool, device=device)
    tree_mask = eye.expand(len(calls), k, k)  # [A, k, k * (level + 1)]: the tree entries each frontier node sees
    active = list(range(len(calls)))
    for level in range(depth):
        going = _going(calls, active, level, scores)
        if not going:
            break
        if len(going) < len(active):
            keep = upload(going, device)
            scores, frontier_tokens, frontier_hidden = scores[keep], frontier_tokens[keep], frontier_hidden[keep]
            frontier_flat, tree_mask = frontier_flat[keep], tree_mask[keep]
            active = [active[i] for i in going]
        slots = len(active)
        embeds = calls[0].embed(frontier_tokens)  # the slots' heads share their weights (share_with)
        mine = [calls[b] for b in active]
        out = _level_forward(mine, [committed[b] for b in active], embeds, frontier_hidden, level, tree_mask)
        top_values, top_indices, _ = head.top_log_probs(out.reshape(slots * k, -1), k)
        cumulative = (top_values.view(slots, k, k) + scores[:, :, None]).view(slots, k * k)
        order = torch.sort(cumulative, dim=-1, descending=True, stable=True).indices[:, :k]  # ties: earlier first
        scores = cumulative.gather(1, order)
        rows = order // k  # each new frontier node's parent row
        ids = to_target(top_indices.view(slots, k * k))
        parents = frontier_flat + 1
        frontier_flat = order + (k + level * k * k)
        frontier_hidden = out.gather(1, rows[:, :, None].expand(-1, -1, out.shape[-1]))
        frontier_tokens = ids.gather(1, order)
        seen = tree_mask.gather(1, rows[:, :, None].expand(-1, -1, tree_mask.shape[-1]))
        tree_mask = torch.cat([seen, eye.expand(slots, k, k)], dim=2)
        batch.levels.append((list(active), ids, cumulative, parents))
        for b, tokens, values, parent in zip(active, _rows(ids), _rows(cumulative), _rows(parents)):
            found[b].tokens.append(tokens)
            found[b].scores.append(values)
            found[b].group_parent.append(parent)
            found[b].levels = level + 1
    for call, length in zip(calls, committed):
        call.cache.keep(length, None, 0)  # tree levels are scratch: drop them
    return found


def _rows(batched: Tensor) -> tuple[Tensor, ...]:
    """Each slot's row of a [slots, ...] tensor, as views (one op for every slot)."""
    return batched.unbind(0)


def _going(calls: list[ExpandCall], active: list[int], level: int, scores: Tensor) -> list[int]:
    """Which of the active slots (positions in `active`) expand another level: their checkpoint, given their
    frontier scores, does not stop them, nor does their `levels`."""
    rows = _rows(scores) if any(calls[b].checkpoint is not None for b in active) else [None] * len(active)
    going = []
    for i, (b, frontier_scores) in enumerate(zip(active, rows)):
        call = calls[b]
        if call.checkpoint is not None and call.checkpoint(level, frontier_scores):
            continue
        if call.levels is None or level < call.levels:
            going.append(i)
    return going


def _level_forward(
    calls: list[ExpandCall], committed: list[int], embeds: Tensor, hidden: Tensor, level: int, tree_mask: Tensor
) -> Tensor:
    """One drafting level: each slot's frontier [k] (embeds, hidden [A, k, H]) through the head on its own
    cache after its committed entries and the tree levels before, each node seeing its committed positions and
    the tree entries `tree_mask` [A, k, T] -> [A, k, H]. Several slots: one forward over their rows where the
    head's engine has one."""
    slots, k = embeds.shape[:2]
    head, caches, device = calls[0].head, [c.cache for c in calls], embeds.device
    if slots > 1 and head.runs_rows(caches):
        starts = upload(committed, device)  # [A]
        positions = (starts + level)[:, None].expand(slots, k).reshape(-1)
        masks = list(prefix_tree_masks(starts, tree_mask, max(committed), torch.float32).unbind(0))
        out = head.rows(
            embeds.reshape(slots * k, -1), hidden.reshape(slots * k, -1), caches, positions, masks, [k] * slots
        )
        return out.view(slots, k, -1)
    outs = []
    for i, (cache, length) in enumerate(zip(caches, committed)):
        allowed = torch.ones(k, length + tree_mask.shape[-1], dtype=torch.bool, device=device)
        allowed[:, length:] = tree_mask[i]
        positions = torch.full((k,), length + level, device=device)
        outs.append(head_step(head, cache, embeds[i], hidden[i], positions, allowed, compiled=True))
    return outs[0][None] if slots == 1 else torch.stack(outs)
