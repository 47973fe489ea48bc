"""The block draft source (`source: dflash`): a DFlash-style drafter predicts a whole block in one forward
(graft/draft_models/dflash/model.py), and the block becomes a draft tree the rest of the composition treats like any
other: a split prunes it, retrievers graft onto it, the decode loop verifies it.

Per step:
1. extend: the drafter puts the context features of the tokens committed by the last verification on its
   own caches (the prompt's after the prefill);
2. block: one forward over [root, mask x (B - 1)] gives a distribution per block position [B - 1, V];
3. tree: with top_k 1 the argmax of each position, a chain (DFlash itself); with top_k > 1 each position's
   top-k hang below the previous position's best candidates, scored by cumulative log-probability and
   kept as the EAGLE-2 expansion keeps them (`dflash_tree`, beyond the paper). The split sees the
   frontier after every position and says how much the draft keeps (dense: all; prefix: the positions
   the drafter is confident in, for Graft(TAIL) on blocks).

Methods: dflash (dense chain), dflash_graft (prefix split + retrieval attached at the tail), dflash_tree
(top-k tree + stage split + retrieval at the root); configs/method/dflash*.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

import torch
from torch import Tensor

from graft.backends.target import HiddenTap, TargetBackend
from graft.draft_models.dflash.checkpoint import load_block_drafter, random_block_drafter
from graft.draft_models.dflash.model import BlockDrafter
from graft.drafter import PrefillInfo, SequenceState, StepFeedback, TargetNeeds, drive, run_grouped
from graft.methods.eagle_tree import Checkpoint
from graft.ops import upload
from graft.parts import Draft, DraftSource, Split
from graft.registry import register
from graft.tree import Candidates, DraftTree, best_k, select


@dataclass
class BlockParams:
    # Hub id, local directory, or "random" (seeded random weights, for tests); None: the model's block_drafter
    checkpoint: str | None = None
    block_size: int | None = None  # positions per block, the committed token included; None: the checkpoint's
    top_k: int = 1  # 1: the block's argmax chain (DFlash); > 1: a tree of each position's top-k
    seed: int = 0  # "random" drafters
    random_layers: int = 1  # "random" drafters: decoder layers

    def __post_init__(self):
        if self.block_size is not None and self.block_size < 2:
            raise ValueError(f"block_size={self.block_size}; a block needs the committed token and >= 1 mask (>= 2)")
        if self.top_k < 1 or self.random_layers < 1:
            raise ValueError(f"need top_k >= 1 and random_layers >= 1; got {self.top_k}, {self.random_layers}")


def block_candidates(logp: Tensor, top_k: int, checkpoint: Checkpoint | None = None) -> Candidates:
    """Candidates from per-position log-probabilities logp [P, V] (row i: block position i + 1): the root's
    children are row 0's top-k; each later level puts row i's top-k below every frontier node and keeps the
    global top-k by cumulative log-probability as the next frontier (with top_k 1: the argmax chain).
    `checkpoint(level, frontier scores)` runs after each level is scored and may stop the tree there."""
    device = logp.device
    top = torch.topk(logp, top_k, dim=-1)  # [P, k]: every node at depth i + 1 chooses from row i
    scores = top.values[0]
    found = Candidates([top.indices[0]], [scores], [torch.zeros(1, dtype=torch.long, device=device)], top_k, 0)
    frontier_flat = torch.arange(top_k, device=device)
    for level in range(logp.shape[0]):
        if checkpoint is not None and checkpoint(level, scores):
            break
        if level + 1 == logp.shape[0]:
            break
        row_values, row_tokens = top.values[level + 1], top.indices[level + 1]
        cumulative = scores[:, None] + row_values[None, :]  # [k, k]
        found.group_parent.append(frontier_flat + 1)
        found.tokens.append(row_tokens.repeat(top_k))
        found.scores.append(cumulative.view(-1))
        scores, best = best_k(cumulative.view(-1), top_k)
        frontier_flat = best + top_k + level * top_k * top_k
        found.levels = level + 1
    return found


@register("source", "dflash", params=BlockParams, description="DFlash-style block drafter: one forward per block")
class BlockSource(DraftSource):
    splits = ("dense", "prefix", "stage", "confident", "fixed")  # the block shrinks to total_tokens: no capacity

    def __init__(self, params: BlockParams, target: TargetBackend):
        self.params, self.target = params, target
        if params.checkpoint == "random":
            self.model: BlockDrafter = random_block_drafter(
                target, params.seed, num_layers=params.random_layers, block_size=params.block_size or 8
            )
        else:
            self.model = load_block_drafter(params.checkpoint, target)
        self.model.lean(target.ops.product)
        cfg = self.model.cfg
        self.block_size = params.block_size or cfg.block_size
        self.needs = TargetNeeds(
            taps=tuple(HiddenTap(i, "output") for i in cfg.target_layer_ids), embeddings=True, lm_head=True
        )
        self.mask = torch.tensor([cfg.mask_token_id], dtype=torch.long, device=target.device)

    def share_with(self, first: "BlockSource") -> None:
        """In a batch the slots share one drafter's weights (read only), so every slot's block is one forward
        (BlockCall.run_all); each slot keeps its own context caches."""
        self.model = first.model

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        self.caches = self.model.new_caches(len(prefill.state.tokens) + 512)
        self.model.encode(prefill.forward.hidden, self.caches)  # every prompt position

    @torch.inference_mode()
    def update(self, step: StepFeedback) -> None:
        drive(self.update_steps(step))

    def update_steps(self, step: StepFeedback) -> Generator:
        yield EncodeCall(self, step.forward.hidden[step.acceptance.index])  # root + accepted nodes

    @torch.inference_mode()
    def block_log_probs(self, root: int, size: int) -> Tensor:
        """[size - 1, V] log-probabilities of block positions 1 .. size - 1 after `root` (a batch of one block)."""
        return _blocks([BlockCall(self, root, size)])[0]

    @torch.inference_mode()
    def draft(self, state: SequenceState, split: Split, total_tokens: int) -> Draft:
        return drive(self.draft_steps(state, split, total_tokens))

    def draft_steps(self, state: SequenceState, split: Split, total_tokens: int) -> Generator:
        size = min(self.block_size, total_tokens) if self.params.top_k == 1 else self.block_size
        if size < 2:  # a budget of the root alone
            return Draft(DraftTree.root_only(state.root, self.target.device))
        split.start()
        logp = yield BlockCall(self, state.root, size)
        found = block_candidates(logp, self.params.top_k, split.stop_after)
        keep = split.keep(torch.cat(found.scores), total_tokens)
        root = state.root_on(self.mask.device)
        return Draft(select(found, root, keep - 1), split.label(), widen=lambda n: select(found, root, n))


@dataclass
class BlockCall:
    """One sequence's block forward (BlockSource.block_log_probs); a batch runs every slot's blocks of one drafter
    and size as one forward (run_all: BlockDrafter.block_rows, the LM head once over every row)."""

    source: BlockSource
    root: int
    size: int

    def run(self) -> Tensor:
        return self.source.block_log_probs(self.root, self.size)

    @staticmethod
    @torch.inference_mode()
    def run_all(calls: list["BlockCall"]) -> list[Tensor]:
        return run_grouped(calls, lambda c: (id(c.source.model), c.size), _blocks)


def _blocks(calls: list[BlockCall]) -> list[Tensor]:
    """Each call's [size - 1, V] log-probabilities: the blocks [root, mask x (size - 1)] of one drafter in one
    forward, each after its own caches, and the LM head once over every block's mask positions."""
    source, size = calls[0].source, calls[0].size
    ids = torch.cat(
        [upload([c.root for c in calls], source.mask.device)[:, None], source.mask.expand(len(calls), size - 1)], 1
    )
    hidden = source.model.block_rows(source.target.embed(ids.view(-1)), [c.source.caches for c in calls])
    drafted = hidden.view(len(calls), size, -1)[:, 1:].reshape(-1, hidden.shape[-1])  # every block's masks
    logp = torch.log_softmax(source.target.lm_head(drafted).float(), dim=-1)
    return list(logp.view(len(calls), size - 1, -1).unbind(0))


@dataclass
class EncodeCall:
    """After a verification, put one sequence's newly committed context features on its drafter's caches; a
    batch encodes every slot's of one drafter as one forward (run_all: BlockDrafter.encode_rows)."""

    source: BlockSource
    features: Tensor  # [committed, F]

    def run(self) -> None:
        self.source.model.encode(self.features, self.source.caches)

    @staticmethod
    @torch.inference_mode()
    def run_all(calls: list["EncodeCall"]) -> list[None]:
        def encode(group: list[EncodeCall]) -> list[None]:
            group[0].source.model.encode_rows([c.features for c in group], [c.source.caches for c in group])
            return [None] * len(group)

        return run_grouped(calls, lambda c: id(c.source.model), encode)
