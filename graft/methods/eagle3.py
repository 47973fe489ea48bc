"""EAGLE-3 (and EAGLE-1/2 heads): the dense dynamic draft tree of EAGLE-2/3.

Draft phase, per step:
1. extend: encode the pairs (token t+1, target feature at t) that the last verification accepted,
   on the head's own cache (only new tokens are encoded; the cache carries across steps);
2. expand: from the last position, take the top-k children of the root; then `depth` times expand every
   frontier node by its top-k children, score each child by cumulative log-probability, and keep the
   global top-k as the next frontier (tree levels go on the cache behind a tree mask, then are dropped);
3. select: keep the best `total_tokens - 1` of all k + depth * k^2 scored candidates, in candidate
   order, which makes the set ancestor-closed because scores fall along a path.
The tree has the same nodes and parents as the published algorithm on the same inputs; where scores
are exactly equal, the earlier candidate wins (the reference leaves that to topk, which can then keep
a child without its parent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from graft.drafter import Drafter, PrefillInfo, SequenceState, StepFeedback, register
from graft.eagle.checkpoint import HeadLoadError, load_head, random_head
from graft.eagle.head import DraftCache, DraftHead
from graft.target import HiddenTap
from graft.tree import DraftTree, NodeSource


@dataclass
class Eagle3Params:
    head: str | None = None  # Hub id, local directory, or "random" (seeded random weights, for tests); None: the model's draft_head
    total_tokens: int = 60  # verified nodes, root included
    depth: int = 7
    top_k: int = 10
    random_layer_ids: list[int] | None = None  # "random" heads: which target layers' inputs to fuse
    random_kind: str = "eagle3"  # "random" heads: eagle3 or eagle1
    seed: int = 0

    def __post_init__(self):
        if self.top_k < 1 or self.depth < 1 or self.total_tokens < 2:
            raise ValueError(f"need top_k >= 1, depth >= 1, total_tokens >= 2; got {self.top_k}, {self.depth}, {self.total_tokens}")


def _additive(allowed: Tensor, dtype) -> Tensor:
    """bool [n, S] -> additive [1, 1, n, S]."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def _best(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top k values and their indices, ties broken by index: a parent comes before a child of equal
    score (a child's log-prob can round to 0), so the kept set stays ancestor-closed."""
    order = torch.sort(values, descending=True, stable=True).indices[:k]
    return values[order], order


def extend(head: DraftHead, cache: DraftCache, embeds: Tensor, hidden: Tensor) -> Tensor:
    """Encode n new (embedding, feature) pairs after the cache's committed positions -> [n, H]."""
    n, start = embeds.shape[0], cache.length
    positions = torch.arange(start, start + n, device=embeds.device)
    mask = None
    if n > 1:
        allowed = torch.ones(n, start + n, dtype=torch.bool, device=embeds.device)
        allowed[:, start:] = torch.tril(allowed[:, start:])
        mask = _additive(allowed, head.fc.weight.dtype)
    return head.step(embeds, hidden, positions, mask, cache)


@dataclass
class Candidates:
    """Scored draft candidates of the EAGLE-2 expansion, in generation order (groups of top_k)."""

    tokens: list[Tensor]  # per group [top_k] target ids
    scores: list[Tensor]  # per group [top_k] cumulative log-probs
    group_parent: list[Tensor]  # per level: 1-based flat candidate index of each group's parent (0 = root)
    top_k: int
    levels: int  # expansion levels done after the root's children (0 .. depth)

    @property
    def count(self) -> int:
        return sum(t.shape[0] for t in self.tokens)


Checkpoint = Callable[[int, Tensor], bool]  # (levels done, frontier scores [top_k]) -> stop drafting here


def expand(head: DraftHead, embed, cache: DraftCache, last: Tensor, depth: int, top_k: int, checkpoint: Checkpoint | None = None) -> Candidates:
    """Score the root's top-k children from the head's output `last` [H] at the last committed position,
    then `depth` times expand every frontier node by its top-k children, keeping the global top-k by
    cumulative log-probability as the next frontier. `checkpoint` may stop it after any level."""
    device, dtype = last.device, head.fc.weight.dtype
    committed = cache.length
    logp, d2t = head.log_probs(last[None])  # [1, V_draft]
    top = torch.topk(logp[0], top_k)
    to_target = (lambda ids: ids + d2t[ids]) if d2t is not None else (lambda ids: ids)  # noqa: E731
    scores = top.values  # [k] cumulative log-probs of the frontier
    found = Candidates([to_target(top.indices)], [scores], [torch.zeros(1, dtype=torch.long, device=device)], top_k, 0)
    frontier_tokens = found.tokens[0]  # [k]
    frontier_hidden = last[None].expand(top_k, -1)  # [k, H]
    frontier_flat = torch.arange(top_k, device=device)  # flat candidate index of each frontier node
    eye = torch.eye(top_k, dtype=torch.bool, device=device)
    tree_mask = eye  # [k, k * (level + 1)]: which tree entries on the cache each frontier node sees

    for level in range(depth):
        if checkpoint is not None and checkpoint(level, scores):
            break
        allowed = torch.ones(top_k, committed + tree_mask.shape[1], dtype=torch.bool, device=device)
        allowed[:, committed:] = tree_mask
        positions = torch.full((top_k,), committed + level, device=device)
        out = head.step(embed(frontier_tokens), frontier_hidden, positions, _additive(allowed, dtype), cache)  # [k, H]
        found.group_parent.append(frontier_flat + 1)
        logp, _ = head.log_probs(out)  # [k, V_draft]
        top = torch.topk(logp, top_k, dim=-1)  # per frontier node
        cumulative = top.values + scores[:, None]  # [k, k]
        scores, best = _best(cumulative.view(-1), top_k)
        rows = best // top_k
        offset = top_k + level * top_k * top_k  # flat index of this level's first candidate
        frontier_flat = best + offset
        frontier_hidden = out[rows]
        frontier_tokens = to_target(top.indices.view(-1)[best])
        found.tokens.append(to_target(top.indices.view(-1)))
        found.scores.append(cumulative.view(-1))
        found.levels = level + 1
        tree_mask = torch.cat([tree_mask[rows], eye], dim=1)
    cache.length = committed  # tree levels are scratch: drop them
    return found


def select(found: Candidates, root: int, keep: int) -> DraftTree:
    """The best `keep` candidates by cumulative log-probability, in candidate order (= topological order),
    as a tree under `root`; ancestor-closed because scores fall along a path."""
    all_scores = torch.cat(found.scores)  # [k + levels * k^2]
    all_tokens = torch.cat(found.tokens)
    group_parent = torch.cat(found.group_parent)  # [1 + levels * k]
    device = all_scores.device
    keep = max(0, min(keep, all_scores.shape[0]))
    chosen = torch.sort(_best(all_scores, keep)[1]).values
    parent_flat = group_parent[chosen // found.top_k]  # 0 = root, else 1 + flat index of the parent candidate
    parent_pos = torch.searchsorted(chosen, parent_flat - 1) + 1
    parents = torch.where(parent_flat == 0, torch.zeros_like(parent_pos), parent_pos)
    sources = torch.full((keep + 1,), int(NodeSource.DRAFT), dtype=torch.int8, device=device)
    sources[0] = NodeSource.ROOT
    return DraftTree(
        tokens=torch.cat([torch.tensor([root], device=device), all_tokens[chosen]]),
        parents=torch.cat([torch.tensor([-1], device=device), parents]),
        scores=torch.cat([torch.zeros(1, device=device), all_scores[chosen]]),
        sources=sources,
    )


def grow_tree(head: DraftHead, embed, cache: DraftCache, last: Tensor, root: int, total_tokens: int, depth: int, top_k: int) -> DraftTree:
    """The EAGLE-2/3 dynamic tree from the head's output `last` [H] at the last committed position."""
    return select(expand(head, embed, cache, last, depth, top_k), root, total_tokens - 1)


@register("eagle3", params=Eagle3Params, description="EAGLE-3 head, EAGLE-2/3 dynamic tree")
class Eagle3Drafter(Drafter):
    params: Eagle3Params

    def __init__(self, target, params: Eagle3Params):
        super().__init__(target, params)
        source = params.head
        if source is None:
            raise HeadLoadError("method=eagle3 needs a draft head: set method.head=<Hub id, local directory or 'random'>")
        if source == "random":
            self.head: DraftHead = random_head(target.model, params.random_kind, params.seed, params.random_layer_ids)
        else:
            self.head = load_head(source, target.model)
        cfg = self.head.cfg
        if cfg.kind == "eagle3":
            self.hidden_taps = tuple(HiddenTap(layer, "input") for layer in cfg.layer_ids)
        else:
            self.hidden_taps = (HiddenTap(-1, "final"),)
        self._embed = target.model.get_input_embeddings()

    def max_nodes(self) -> int:
        return self.params.total_tokens

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        state = prefill.state
        self.cache = self.head.new_cache(len(state.tokens) + 512)
        # the head pairs the target feature at position t with the token at t + 1
        self._pending_tokens = state.tokens[1:]
        self._pending_hidden = prefill.forward.hidden

    def _catch_up(self) -> Tensor:
        """Encode what the last verification accepted on the head's cache -> the head's output at the last position [H]."""
        ids = torch.tensor(self._pending_tokens, dtype=torch.long, device=self.target.device)
        return extend(self.head, self.cache, self._embed(ids), self._pending_hidden)[-1]

    @torch.inference_mode()
    def propose(self, state: SequenceState) -> DraftTree:
        p = self.params
        return grow_tree(self.head, self._embed, self.cache, self._catch_up(), state.root, p.total_tokens, p.depth, p.top_k)

    def update(self, step: StepFeedback) -> None:
        self._pending_tokens = step.acceptance.tokens
        self._pending_hidden = step.forward.hidden[step.acceptance.index]
