"""Graft: prune the draft tree where the draft is unsure, retrieve tokens for the freed budget, graft them on.

Per step:
1. prune   - EAGLE-3 expansion with confidence checkpoints (graft/methods/pruned.py) picks a stage, which
             fixes the draft / retrieval split of the `total_tokens` budget;
2. retrieve - the Token-Recycling table read through a static rank template rooted at the current root
             token (graft/retrieval/recycling.py) and/or a suffix-automaton continuation;
3. graft   - the retrieved subtree joins the draft tree at the shared root; duplicates merge and the
             slots they free go to the next template nodes (graft/grafting.py);
4. verify  - the decode loop verifies the united tree; `update` then refreshes the table from every
             verified node's logits.

Options beyond the paper: `attach=leaves` (continue the best pruned frontier leaves with rank-0 chains from
the table) or `both`; `retrieval=suffix` (SAM-Decoding's automaton over prompt + output) or `both`.
The ablations are the same drafter with other settings (configs/method/graft_*.yaml):
- graft_root:    no checkpoints; a fixed split (`fixed_draft_nodes`), retrieval at the root;
- graft_noprune: the checkpoints choose the split, but the draft is chosen from the full-depth tree
                 (drafting never stops early);
- graft_tail:    chain form: a top-1 draft chain kept while its confidence stays >= `tail_threshold`,
                 the rest of the budget retrieved from the table under the chain's last kept token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from graft.drafter import PrefillInfo, SequenceState, StepFeedback, register
from graft.grafting import graft
from graft.methods.eagle3 import expand, select
from graft.methods.pruned import PrunedDrafter, PruneParams, scaled_split, stage_name
from graft.retrieval.recycling import DEFAULT_RANK_PRIOR, Recycler
from graft.retrieval.suffix import SuffixAutomaton
from graft.tree import DraftTree

ATTACH = ("root", "leaves", "both")
RETRIEVAL = ("recycling", "suffix", "both")


class Grafted:
    """The tree as retrieved subtrees are grafted onto it one after another, within `room` new nodes."""

    def __init__(self, tree: DraftTree, room: int):
        self.tree, self.room, self.added, self.merged = tree, room, 0, 0

    def attach(self, anchor: int, tokens: torch.Tensor, parents: torch.Tensor, room: int | None = None) -> None:
        result = graft(self.tree, anchor, tokens, parents, self.room if room is None else min(room, self.room))
        self.tree = result.tree
        self.room -= result.added
        self.added += result.added
        self.merged += result.merged


@dataclass
class GraftParams(PruneParams):
    prune: bool = True  # stop drafting at the checkpoint that fires (False: graft_noprune)
    fixed_draft_nodes: int | None = None  # no checkpoints, always this many draft nodes for reference_budget (graft_root)
    tail_threshold: float | None = None  # chain form (graft_tail): keep the draft chain while its confidence >= this
    attach: str = "root"  # root | leaves | both
    retrieval: str = "recycling"  # recycling | suffix | both
    table_k: int = 8  # successors per token in the table
    template_depth: int = 8  # deepest template node below its anchor
    rank_prior: list[float] = field(default_factory=lambda: list(DEFAULT_RANK_PRIOR))
    leaf_count: int = 4  # attach=leaves/both: best frontier leaves continued
    leaf_share: float = 0.5  # attach=both: share of the retrieval budget for the leaves
    suffix_tokens: int = 16  # retrieval=suffix/both: longest retrieved continuation
    suffix_min_match: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.attach not in ATTACH:
            raise ValueError(f"attach={self.attach!r}; allowed: {', '.join(ATTACH)}")
        if self.retrieval not in RETRIEVAL:
            raise ValueError(f"retrieval={self.retrieval!r}; allowed: {', '.join(RETRIEVAL)}")
        if self.table_k < 1 or self.table_k > len(self.rank_prior):
            raise ValueError(f"table_k must lie in [1, len(rank_prior)={len(self.rank_prior)}]; got {self.table_k}")
        if self.tail_threshold is not None and not 0.0 <= self.tail_threshold <= 1.0:
            raise ValueError(f"tail_threshold is a probability in [0, 1]; got {self.tail_threshold}")


@register("graft", params=GraftParams, description="prune the EAGLE-3 tree, graft Token-Recycling retrieval on the freed budget")
class GraftDrafter(PrunedDrafter):
    params: GraftParams

    def __init__(self, target, params: GraftParams):
        super().__init__(target, params)
        p = params
        self.recycler = Recycler(target.vocab_size, p.table_k, p.template_depth, p.rank_prior, target.device)
        self.uses_suffix = p.retrieval in ("suffix", "both")
        self.uses_table = p.retrieval in ("recycling", "both") or p.attach != "root"

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        super().reset(prefill)
        state = prefill.state
        self.recycler.reset(state.tokens[: state.prompt_len], prefill.forward.logits)
        self.automaton = SuffixAutomaton()
        if self.uses_suffix:
            self.automaton.sync(state.tokens)

    # -- 1. prune ---------------------------------------------------------------------------------------
    def _draft(self, state: SequenceState) -> tuple[DraftTree, str, int]:
        """(draft tree, stage name, anchor of the root retrieval)."""
        p = self.params
        if p.tail_threshold is not None:
            floor = math.log(max(p.tail_threshold, 1e-30))
            found = expand(self.head, self._embed, self.cache, self._catch_up(), p.depth, p.top_k, lambda level, s: float(s.max()) < floor)
            confident = int((torch.cat(found.scores) >= floor).sum())
            tree = select(found, state.root, min(confident, p.total_tokens - 1))
            return tree, f"tail{tree.num_nodes - 1}", tree.num_nodes - 1 if p.top_k == 1 else 0
        if p.fixed_draft_nodes is not None:
            found = expand(self.head, self._embed, self.cache, self._catch_up(), p.depth, p.top_k)
            keep = scaled_split(p.fixed_draft_nodes, p.total_tokens, p.reference_budget)
            return select(found, state.root, keep - 1), "fixed", 0
        tree, stage = self._pruned_tree(state, stop=p.prune)
        return tree, stage_name(p, stage), 0

    # -- 2 + 3. retrieve and graft ----------------------------------------------------------------------
    def _retrieve_and_graft(self, tree: DraftTree, anchor: int, room: int) -> Grafted:
        p = self.params
        grafted = Grafted(tree, room)
        if p.attach != "root" and tree.num_nodes > 1:
            self._graft_leaves(grafted, room if p.attach == "leaves" else int(room * p.leaf_share))
        if p.attach == "leaves":
            return grafted
        if self.uses_suffix and grafted.room > 0:
            _, continuation = self.automaton.continuation(min(p.suffix_tokens, grafted.room), p.suffix_min_match)
            if continuation:
                tokens = torch.tensor([int(tree.tokens[anchor]), *continuation], dtype=torch.long, device=tree.tokens.device)
                grafted.attach(anchor, tokens, torch.arange(-1, tokens.shape[0] - 1, device=tokens.device))
        if p.retrieval != "suffix" and grafted.room > 0:
            size = min(grafted.room + grafted.tree.num_nodes, 2 * p.total_tokens + 1)  # merges free slots: read further
            grafted.attach(anchor, *self.recycler.subtree(grafted.tree.tokens[anchor], size))
        return grafted

    def _graft_leaves(self, grafted: Grafted, share: int) -> None:
        """Continue the best frontier leaves of the draft (by cumulative log-prob) with rank-0 table chains."""
        tree = grafted.tree
        has_child = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.tokens.device)  # [num_nodes]
        has_child[tree.parents[1:]] = True
        leaf_scores = torch.where(has_child, float("-inf"), tree.scores)
        leaf_scores[0] = float("-inf")
        leaves = torch.topk(leaf_scores, min(self.params.leaf_count, tree.num_nodes - 1)).indices.tolist()
        per_leaf = max(1, share // len(leaves))
        for leaf in leaves:
            budget = min(per_leaf, grafted.room)
            if budget <= 0:
                break
            grafted.attach(leaf, *self.recycler.subtree(tree.tokens[leaf], budget + 1, shape="chain"), room=budget)

    @torch.inference_mode()
    def propose(self, state: SequenceState) -> DraftTree:
        draft, stage, anchor = self._draft(state)
        started = time.perf_counter()
        grafted = self._retrieve_and_graft(draft, anchor, self.params.total_tokens - draft.num_nodes)
        self.last_info = {
            "stage": stage,
            "draft_nodes": draft.num_nodes - 1,
            "retrieved_nodes": grafted.added,
            "merged_nodes": grafted.merged,
            "graft_ms": 1e3 * (time.perf_counter() - started),
        }
        return grafted.tree

    # -- 4. after verification: refresh the table ------------------------------------------------------
    @torch.inference_mode()
    def update(self, step: StepFeedback) -> None:
        started = time.perf_counter()
        if self.uses_table:
            self.recycler.observe(step.tree.tokens, step.forward.logits, step.acceptance.index)
        if self.uses_suffix:
            self.automaton.sync(step.state.tokens)
        if self.last_info is not None:
            self.last_info["graft_ms"] += 1e3 * (time.perf_counter() - started)
        super().update(step)


@dataclass
class GraftRootParams(GraftParams):
    fixed_draft_nodes: int | None = 40


@dataclass
class GraftNoPruneParams(GraftParams):
    prune: bool = False


@dataclass
class GraftTailParams(GraftParams):
    top_k: int = 1
    tail_threshold: float | None = 0.25


@register("graft_root", params=GraftRootParams, description="ablation: no pruning, fixed draft/retrieval split, retrieval at the root")
class GraftRootDrafter(GraftDrafter):
    pass


@register("graft_noprune", params=GraftNoPruneParams, description="ablation: checkpoints pick the split, drafting runs to full depth")
class GraftNoPruneDrafter(GraftDrafter):
    pass


@register("graft_tail", params=GraftTailParams, description="ablation: confident prefix of a draft chain, retrieved tail")
class GraftTailDrafter(GraftDrafter):
    pass
