"""EAGLE draft sources: an EAGLE-3 (or EAGLE-1/2) head on its own cache, drafting the dense dynamic tree
of EAGLE-2/3 (`source: eagle`) or EAGLE-1's static tree (`source: eagle_static`).

Draft phase, per step (the dynamic tree):
1. extend: after each verification the head encodes the pairs (token t+1, target feature at t) that it
   accepted, on the head's own cache (only new tokens are encoded; the cache carries across steps);
2. expand: from the last position, take the top-k children of the root; then `depth` times expand every
   frontier node by its top-k children, score each child by cumulative log-probability, and keep the
   global top-k as the next frontier (tree levels go on the cache behind a tree mask, then are dropped);
   the split (graft/parts.py, graft/methods/pruned.py) may stop the expansion after any level;
3. select: keep the best `keep - 1` of all scored candidates (keep from the split: total_tokens when
   dense), in candidate order, which makes the set ancestor-closed because scores fall along a path.
The tree has the same nodes and parents as the published algorithm on the same inputs; where scores
are exactly equal, the earlier candidate wins (the reference leaves that to topk, which can then keep
a child without its parent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generator, Literal

import torch
from torch import Tensor

from graft.backends.compiling import capacity_bucket
from graft.backends.target import HiddenTap, TargetBackend
from graft.draft_models.eagle.checkpoint import load_head, random_head
from graft.draft_models.eagle.head import DraftHead
from graft.drafter import PrefillInfo, SequenceState, StepFeedback, TargetNeeds, drive
from graft.fixed_size import select_fixed
from graft.kv import KVBuffer
from graft.methods.eagle_tree import ExpandCall, ExtendCall, SelectCall, extend, head_step
from graft.ops import upload
from graft.parts import Draft, DraftSource, Split
from graft.registry import register
from graft.schema import ConfigError
from graft.tree import DraftTree, NodeSource, RankTree, select


@dataclass
class HeadParams:
    head: str | None = (
        None  # Hub id, local directory, or "random" (seeded random weights, for tests); None: the model's draft_head
    )
    random_layer_ids: list[int] | None = None  # "random" heads: which target layers' inputs to fuse
    random_kind: Literal["eagle3", "eagle1"] = "eagle3"  # "random" heads
    seed: int = 0
    # the head's weights (and on the Python path its activations and cache; the native layer keeps those in
    # float32); null: the target's dtype; auto: see head_dtype_for. Drafts need not match the target's
    # arithmetic (the target verifies every token), so a bfloat16 head reads half the bytes per level on a CPU
    head_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = "auto"

    def __post_init__(self):
        ids = self.random_layer_ids
        if ids is not None and (len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0):
            raise ValueError(f"random_layer_ids={ids}; expected three distinct target layer numbers >= 0")


@dataclass
class EagleParams(HeadParams):
    depth: int = 7
    top_k: int = 10

    def __post_init__(self):
        super().__post_init__()
        if self.top_k < 1 or self.depth < 1:
            raise ValueError(f"need top_k >= 1 and depth >= 1; got {self.top_k}, {self.depth}")


@dataclass
class EagleStaticParams(HeadParams):
    static_choices: list[list[int]] | None = None  # rank paths from the root; None: MC_SIM_7B_63

    def __post_init__(self):
        super().__post_init__()
        for path in self.static_choices or []:
            if (
                not path
                or any(r < 0 for r in path)
                or (len(path) > 1 and list(path[:-1]) not in [list(c) for c in self.static_choices])
            ):
                raise ValueError(
                    f"static_choices: each path needs its parent path listed and ranks >= 0; bad path {path}"
                )


# EAGLE-1's default static tree (`mc_sim_7b_63` in SafeAILab/EAGLE, eagle/model/choices.py): each path lists
# the rank of the chosen child at each depth; 25 draft nodes, depth 5.
MC_SIM_7B_63 = [
    [0],
    [1],
    [2],
    [3],
    [0, 0],
    [0, 1],
    [0, 2],
    [1, 0],
    [1, 1],
    [2, 0],
    [2, 1],
    [3, 0],
    [0, 0, 0],
    [0, 0, 1],
    [0, 0, 2],
    [0, 1, 0],
    [0, 1, 1],
    [0, 2, 0],
    [0, 2, 1],
    [1, 0, 0],
    [0, 0, 0, 0],
    [0, 0, 0, 1],
    [0, 0, 0, 2],
    [0, 0, 0, 0, 0],
    [0, 0, 0, 0, 1],
]


@dataclass(frozen=True)
class StaticPlan:
    """A rank tree and, per depth, which nodes the head expands and which of them each child hangs from."""

    shape: RankTree
    expand_at: tuple[Tensor, ...]  # per depth: nodes that have children
    children_at: tuple[Tensor, ...]  # per depth: the children of those nodes
    parent_row: tuple[Tensor, ...]  # per depth: row of each child's parent within expand_at
    width: int  # largest rank + 1

    @staticmethod
    def of(shape: RankTree) -> "StaticPlan":
        expand_at, parent_row = [], []
        for kids in shape.levels:
            owners, rows = torch.unique(shape.parents[kids], sorted=True, return_inverse=True)  # sync ok: once per run
            expand_at.append(owners)
            parent_row.append(rows)
        return StaticPlan(shape, tuple(expand_at), shape.levels, tuple(parent_row), int(shape.ranks.max()) + 1)


def static_tree(head: DraftHead, embed, cache: KVBuffer, last: Tensor, root: int, plan: StaticPlan) -> DraftTree:
    """EAGLE-1's static tree: at each depth the head runs once over the nodes that have children (each
    seeing its ancestors' entries on the head cache), and child i takes its parent's rank-`ranks[i]` token."""
    device = last.device
    shape = plan.shape
    n = shape.size
    committed = cache.length
    tokens = torch.empty(n, dtype=torch.long, device=device)
    tokens[0] = root
    scores = torch.zeros(n, device=device)
    outputs = last.new_empty(n, last.shape[-1])
    outputs[0] = last
    on_cache = torch.empty(0, dtype=torch.long, device=device)  # nodes whose entries are on the cache, in order
    for level, (owners, kids, rows) in enumerate(zip(plan.expand_at, plan.children_at, plan.parent_row)):
        if level > 0:  # depth-`level` nodes go through the head; the root's output is `last`
            allowed = torch.ones(
                owners.shape[0], committed + on_cache.shape[0] + owners.shape[0], dtype=torch.bool, device=device
            )
            allowed[:, committed : committed + on_cache.shape[0]] = shape.ancestors[owners][:, on_cache]
            allowed[:, committed + on_cache.shape[0] :] = torch.eye(owners.shape[0], dtype=torch.bool, device=device)
            positions = torch.full((owners.shape[0],), committed + level - 1, device=device)
            outputs[owners] = head_step(
                head, cache, embed(tokens[owners]), outputs[shape.parents[owners]], positions, allowed
            )
            on_cache = torch.cat([on_cache, owners])
        top_values, top_indices, d2t = head.top_log_probs(outputs[owners], plan.width)  # [owners, width]
        picked = top_indices[rows, shape.ranks[kids]]
        tokens[kids] = picked + d2t[picked] if d2t is not None else picked
        scores[kids] = scores[shape.parents[kids]] + top_values[rows, shape.ranks[kids]]
    cache.keep(committed, None, 0)  # tree levels are scratch: drop them
    return DraftTree.build(tokens, shape.parents, NodeSource.DRAFT, scores)


def head_dtype_for(choice: str | None, target: TargetBackend) -> str | None:
    """method.head_dtype resolved: `auto` is what the target's backend multiplies fastest (its ops say, when it
    loads), else the target's own dtype (None)."""
    return target.ops.draft_head_dtype() if choice == "auto" else choice


class HeadOnCache:
    """An EAGLE head on its own cache, kept level with the committed sequence: after the prefill and after
    every verification it encodes what was committed, so `last` is its output at the last position [H]."""

    def __init__(self, params: HeadParams, target: TargetBackend):
        self.target = target
        if params.head == "random":
            too_deep = [i for i in params.random_layer_ids or [] if i >= target.num_layers]
            if too_deep:
                raise ConfigError(
                    f"method.random_layer_ids={params.random_layer_ids}: the target has layers 0..{target.num_layers - 1}"
                )
            self.head: DraftHead = random_head(target, params.random_kind, params.seed, params.random_layer_ids)
        else:
            self.head = load_head(params.head, target)
        dtype = head_dtype_for(params.head_dtype, target)
        if (
            params.head_dtype == "auto" and (dtype, id(target)) not in _SAID_HEAD_DTYPE
        ):  # once per target, not per method
            _SAID_HEAD_DTYPE.add((dtype, id(target)))
            logging.getLogger(__name__).info("method.head_dtype=auto: %s", dtype or "the target's dtype")
        if dtype is not None:
            self.head = self.head.to(getattr(torch, dtype))
        self.head.lean(target.ops)
        widened = target.ops.product_record(list(self.head.fast.values()))
        if "widened" in widened:
            logging.getLogger(__name__).warning("method.head_dtype=%s: %s", dtype, widened["widened"])
        cfg = self.head.cfg
        taps = (
            tuple(HiddenTap(layer, "input") for layer in cfg.layer_ids)
            if cfg.kind == "eagle3"
            else (HiddenTap(-1, "final"),)
        )
        self.needs = TargetNeeds(taps=taps, embeddings=True, lm_head=cfg.kind == "eagle1")
        self.embed = self.head.embedder(target.embed)  # a head narrower than its target has its own table
        if target.compile_mode is not None:
            self.head.compile(target.compile_mode, target.compile_backend)

    def reset(self, prefill: PrefillInfo) -> None:
        tokens = prefill.state.tokens
        self.cache = self._fresh_cache(len(tokens))
        # the head pairs the target feature at position t with the token at t + 1
        self.last = self._extend(tokens[1:], prefill.forward.hidden)

    def _fresh_cache(self, prompt_len: int) -> KVBuffer:
        """The head's cache for a new sequence. A static one (hardware.compile) follows the target's cache
        bucket and is kept while the bucket is the same, so its compiled levels are reused too."""
        if self.target.compile_mode is None:
            return self.head.new_cache(prompt_len + 512)
        capacity = capacity_bucket(self.target.cache.capacity + 512)  # + the drafted levels' entries
        old = getattr(self, "cache", None)
        if old is not None and old.static and old.capacity == capacity:
            old.keep(0, None, 0)
            return old
        return self.head.new_cache(capacity, static=True)

    def update_steps(self, step: StepFeedback) -> Generator:
        """Encode the step's committed tokens with their features (one head forward; a batch runs every slot's
        as one)."""
        accepted = step.acceptance
        self.last = yield ExtendCall(
            self.head, self.embed, self.cache, accepted.tokens, accepted.token_ids, step.forward.hidden,
            accepted.path, accepted.path_index,
        )  # fmt: skip

    def _extend(self, tokens: list[int], hidden: Tensor) -> Tensor:
        return extend(self.head, self.cache, self.embed(upload(tokens, self.target.device)), hidden)[-1]


class _HeadSource(DraftSource):
    def __init__(self, params: HeadParams, target: TargetBackend):
        self.params = params
        self.runner = HeadOnCache(params, target)
        self.embed = self.runner.embed
        self.needs = self.runner.needs

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        self.runner.reset(prefill)

    @torch.inference_mode()
    def update(self, step: StepFeedback) -> None:
        drive(self.runner.update_steps(step))

    @torch.inference_mode()  # (on a generator: every resume runs under it)
    def update_steps(self, step: StepFeedback) -> Generator:
        yield from self.runner.update_steps(step)

    def share_with(self, first: "_HeadSource") -> None:
        """In a batch the slots share one head's weights (read only), so a level's forward over every slot's
        frontier is one call (ExpandCall.run_all); each slot keeps its own head cache."""
        self.runner.head = first.runner.head


_SAID_HEAD_DTYPE: set = set()


@register("source", "eagle", params=EagleParams, description="EAGLE-3 / EAGLE-1/2 head, EAGLE-2/3 dynamic tree")
class EagleSource(_HeadSource):
    splits = ("dense", "stage", "fixed", "confident", "prefix", "auto")
    supports_fixed_size = True  # drafts fixed-size trees when its split decides on the device
    params: EagleParams

    @torch.inference_mode()
    def draft(self, state: SequenceState, split: Split, total_tokens: int) -> Draft:
        return drive(self.draft_steps(state, split, total_tokens))

    @torch.inference_mode()  # (on a generator: every resume runs under it)
    def draft_steps(self, state: SequenceState, split: Split, total_tokens: int) -> Generator:
        p, runner = self.params, self.runner
        split.start()
        # no work on candidates the split can never keep (a small budget keeps few, shallow nodes); a compiled
        # head step keeps its one frontier width
        width = split.widest_useful(total_tokens) if runner.head.compiled_step is None else None
        top_k = p.top_k if width is None else min(p.top_k, width)
        levels = split.levels_needed(total_tokens)
        found = yield ExpandCall(
            runner.head, self.embed, runner.cache, runner.last, p.depth, top_k, split.stop_after, levels
        )
        keep = split.keep(torch.cat(found.scores), total_tokens)
        if isinstance(keep, Tensor):  # a split deciding on the device (fixed-size trees)
            root = state.root_on(runner.last.device)
            return Draft(select_fixed(found, root, keep - 1, total_tokens - 1, split.level_cap()), split.label())
        tree = yield SelectCall(found, state.root_here(runner.last.device), keep - 1)
        return Draft(tree, split.label(), widen=lambda n: select(found, state.root_here(runner.last.device), n))


@register(
    "source", "eagle_static", params=EagleStaticParams, description="EAGLE-1's static tree (mc_sim_7b_63 by default)"
)
class EagleStaticSource(_HeadSource):
    params: EagleStaticParams

    def __init__(self, params: EagleStaticParams, target: TargetBackend):
        super().__init__(params, target)
        self.plan = StaticPlan.of(RankTree.from_paths(params.static_choices or MC_SIM_7B_63, target.device))

    @staticmethod
    def capacity_of(params: EagleStaticParams) -> int:
        return len(params.static_choices or MC_SIM_7B_63)

    @torch.inference_mode()
    def draft(self, state: SequenceState, split: Split, total_tokens: int) -> Draft:
        runner = self.runner
        return Draft(static_tree(runner.head, self.embed, runner.cache, runner.last, state.root, self.plan))
