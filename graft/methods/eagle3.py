"""EAGLE-3 (and EAGLE-1/2 heads): the dense dynamic draft tree of EAGLE-2/3.

Draft phase, per step:
1. extend: encode the pairs (token t+1, target feature at t) that the last verification accepted,
   on the head's own cache (only new tokens are encoded; the cache carries across steps);
2. grow: from the last position, take the top-k children of the root; then `depth` times expand every
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


def grow_tree(head: DraftHead, embed, cache: DraftCache, last: Tensor, root: int, total_tokens: int, depth: int, top_k: int) -> DraftTree:
    """The EAGLE-2/3 dynamic tree from the head's output `last` [H] at the last committed position."""
    device, dtype = last.device, head.fc.weight.dtype
    committed = cache.length
    logp, d2t = head.log_probs(last[None])  # [1, V_draft]
    top = torch.topk(logp[0], top_k)
    to_target = (lambda ids: ids + d2t[ids]) if d2t is not None else (lambda ids: ids)  # noqa: E731
    scores = top.values  # [k] cumulative log-probs of the frontier
    tokens_by_group = [to_target(top.indices)]  # candidate tokens, group by group
    scores_by_group = [scores]
    parent_of_group = [torch.zeros(1, dtype=torch.long, device=device)]  # 1-based flat index of each group's parent
    frontier_tokens = tokens_by_group[0]  # [k]
    frontier_hidden = last[None].expand(top_k, -1)  # [k, H]
    frontier_flat = torch.arange(top_k, device=device)  # flat candidate index of each frontier node
    eye = torch.eye(top_k, dtype=torch.bool, device=device)
    tree_mask = eye  # [k, k * (level + 1)]: which tree entries on the cache each frontier node sees

    for level in range(depth):
        allowed = torch.ones(top_k, committed + tree_mask.shape[1], dtype=torch.bool, device=device)
        allowed[:, committed:] = tree_mask
        positions = torch.full((top_k,), committed + level, device=device)
        out = head.step(embed(frontier_tokens), frontier_hidden, positions, _additive(allowed, dtype), cache)  # [k, H]
        parent_of_group.append(frontier_flat + 1)
        logp, _ = head.log_probs(out)  # [k, V_draft]
        top = torch.topk(logp, top_k, dim=-1)  # per frontier node
        cumulative = top.values + scores[:, None]  # [k, k]
        scores, best = _best(cumulative.view(-1), top_k)
        rows = best // top_k
        offset = top_k + level * top_k * top_k  # flat index of this level's first candidate
        frontier_flat = best + offset
        frontier_hidden = out[rows]
        frontier_tokens = to_target(top.indices.view(-1)[best])
        tokens_by_group.append(to_target(top.indices.view(-1)))
        scores_by_group.append(cumulative.view(-1))
        tree_mask = torch.cat([tree_mask[rows], eye], dim=1)
    cache.length = committed  # tree levels are scratch: drop them

    all_scores = torch.cat(scores_by_group)  # [k + depth * k^2]
    all_tokens = torch.cat(tokens_by_group)
    group_parent = torch.cat(parent_of_group)  # [1 + depth * k]
    keep = min(total_tokens - 1, all_scores.shape[0])
    chosen = torch.sort(_best(all_scores, keep)[1]).values  # candidate order = topological order
    parent_flat = group_parent[chosen // top_k]  # 0 = root, else 1 + flat index of the parent candidate
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

    @torch.inference_mode()
    def propose(self, state: SequenceState) -> DraftTree:
        device = self.target.device
        ids = torch.tensor(self._pending_tokens, dtype=torch.long, device=device)
        out = extend(self.head, self.cache, self._embed(ids), self._pending_hidden)
        p = self.params
        return grow_tree(self.head, self._embed, self.cache, out[-1], state.root, p.total_tokens, p.depth, p.top_k)

    def update(self, step: StepFeedback) -> None:
        self._pending_tokens = step.acceptance.tokens
        self._pending_hidden = step.forward.hidden[step.acceptance.index]
