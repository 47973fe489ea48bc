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
    static_tree: bool = False  # the EAGLE-1 static tree (`static_choices`) instead of the dynamic one
    static_choices: list[list[int]] | None = None  # rank paths from the root; None: MC_SIM_7B_63

    def __post_init__(self):
        if self.static_choices is not None:
            for path in self.static_choices:
                if not path or any(r < 0 for r in path) or (len(path) > 1 and list(path[:-1]) not in [list(c) for c in self.static_choices]):
                    raise ValueError(f"static_choices: each path needs its parent path listed and ranks >= 0; bad path {path}")
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


# EAGLE-1's default static tree (`mc_sim_7b_63` in SafeAILab/EAGLE, eagle/model/choices.py): each path lists
# the rank of the chosen child at each depth; 25 draft nodes, depth 5.
MC_SIM_7B_63 = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0], [0, 0, 1],
    [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]


@dataclass(frozen=True)
class StaticTree:
    """A fixed tree of ranks, flattened in (depth, path) order, with per-depth index tensors built once."""

    parents: Tensor  # [n] int64, parents[0] = -1
    ranks: Tensor  # [n] int64
    ancestors: Tensor  # [n, n] bool
    expand_at: tuple[Tensor, ...]  # per depth: nodes that have children
    children_at: tuple[Tensor, ...]  # per depth: the children of those nodes
    parent_row: tuple[Tensor, ...]  # per depth: row of each child's parent within expand_at
    width: int  # largest rank + 1

    @staticmethod
    def from_choices(choices: list[list[int]], device="cpu") -> "StaticTree":
        from graft.tree import tree_attention

        paths = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
        index = {(): 0}
        parents, ranks, depth = [-1], [0], [0]
        for path in paths:
            index[path] = len(parents)
            parents.append(index[path[:-1]])
            ranks.append(path[-1])
            depth.append(len(path))
        expand_at, children_at, parent_row = [], [], []
        for level in range(max(depth)):
            kids = [i for i in range(len(parents)) if depth[i] == level + 1]
            owners = sorted({parents[i] for i in kids})
            expand_at.append(torch.tensor(owners, device=device))
            children_at.append(torch.tensor(kids, device=device))
            parent_row.append(torch.tensor([owners.index(parents[i]) for i in kids], device=device))
        parents_t = torch.tensor(parents, device=device)
        return StaticTree(
            parents_t, torch.tensor(ranks, device=device), tree_attention(parents_t, 0).ancestors,
            tuple(expand_at), tuple(children_at), tuple(parent_row), max(ranks) + 1,
        )


def static_tree(head: DraftHead, embed, cache: DraftCache, last: Tensor, root: int, shape: StaticTree) -> DraftTree:
    """EAGLE-1's static tree: at each depth the head runs once over the nodes that have children (each
    seeing its ancestors' entries on the head cache), and child i takes its parent's rank-`ranks[i]` token."""
    device, dtype = last.device, head.fc.weight.dtype
    n = shape.parents.shape[0]
    committed = cache.length
    tokens = torch.empty(n, dtype=torch.long, device=device)
    tokens[0] = root
    scores = torch.zeros(n, device=device)
    outputs = last.new_empty(n, last.shape[-1])
    outputs[0] = last
    on_cache = torch.empty(0, dtype=torch.long, device=device)  # nodes whose entries are on the cache, in order
    for level, (owners, kids, rows) in enumerate(zip(shape.expand_at, shape.children_at, shape.parent_row)):
        if level > 0:  # depth-`level` nodes go through the head; the root's output is `last`
            allowed = torch.ones(owners.shape[0], committed + on_cache.shape[0] + owners.shape[0], dtype=torch.bool, device=device)
            allowed[:, committed : committed + on_cache.shape[0]] = shape.ancestors[owners][:, on_cache]
            allowed[:, committed + on_cache.shape[0] :] = torch.eye(owners.shape[0], dtype=torch.bool, device=device)
            positions = torch.full((owners.shape[0],), committed + level - 1, device=device)
            outputs[owners] = head.step(embed(tokens[owners]), outputs[shape.parents[owners]], positions, _additive(allowed, dtype), cache)
            on_cache = torch.cat([on_cache, owners])
        logp, d2t = head.log_probs(outputs[owners])  # [owners, V_draft]
        top = torch.topk(logp, shape.width, dim=-1)
        picked = top.indices[rows, shape.ranks[kids]]
        tokens[kids] = picked + d2t[picked] if d2t is not None else picked
        scores[kids] = scores[shape.parents[kids]] + top.values[rows, shape.ranks[kids]]
    cache.length = committed
    sources = torch.full((n,), int(NodeSource.DRAFT), dtype=torch.int8, device=device)
    sources[0] = NodeSource.ROOT
    return DraftTree(tokens=tokens, parents=shape.parents, scores=scores, sources=sources)


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
        self._static = StaticTree.from_choices(params.static_choices or MC_SIM_7B_63, target.device) if params.static_tree else None

    def max_nodes(self) -> int:
        return self._static.parents.shape[0] if self._static is not None else self.params.total_tokens

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
        self._last_output = self._catch_up()  # [H] the head at the last committed position
        if self._static is not None:
            return static_tree(self.head, self._embed, self.cache, self._last_output, state.root, self._static)
        return grow_tree(self.head, self._embed, self.cache, self._last_output, state.root, p.total_tokens, p.depth, p.top_k)

    def update(self, step: StepFeedback) -> None:
        self._pending_tokens = step.acceptance.tokens
        self._pending_hidden = step.forward.hidden[step.acceptance.index]
