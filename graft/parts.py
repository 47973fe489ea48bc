"""The parts a method is composed of (graft/compose.py puts them together): a draft source and its Draft, the
budget split that watches it, retrievers and what they retrieve, the attach policy that grafts it, the trim.
Each kind is registered by name (graft/registry.py) and chosen by the method's config.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Generator

import torch
from torch import Tensor

from graft.backends.target import TargetBackend
from graft.drafter import PrefillInfo, SequenceState, StepFeedback, TargetNeeds
from graft.grafting import Grafted
from graft.ops import upload
from graft.registry import register
from graft.tree import DraftTree


@dataclass
class Draft:
    """A source's tree for one step (its nodes marked DRAFT) and the split's label for the step. `widen(n)`,
    where the source has one: its best n candidates of the step (root added) as a tree, the kept ones among
    them - what method.refill reads when retrieval leaves part of the budget empty."""

    tree: DraftTree
    stage: str | None = None
    widen: Callable[[int], DraftTree] | None = None


@dataclass
class Retrieved:
    """A retrieved subtree: node 0 is the anchor's token, -1 marks a token the retriever does not know."""

    tokens: Tensor  # [m] int64
    parents: Tensor  # [m] int64, parents[0] = -1
    chain: bool = False  # a chain of known tokens (prompt lookup, suffix): grafts onto a bare root without merging

    @staticmethod
    def chain_of(anchor_token: int, continuation: list[int], device) -> "Retrieved":
        """anchor -> continuation[0] -> continuation[1] -> ... (tokens the text itself supplied)."""
        tokens = upload([anchor_token, *continuation], device)
        return Retrieved(tokens, torch.arange(-1, len(continuation), device=device), chain=True)


class Proposer:
    """What draft sources and retrievers share: a size for the budget, the sequence's lifecycle, and whether it
    can run with fixed-size trees (graft/fixed_size.py: every part of a method must, for the method to)."""

    supports_fixed_size = False

    @staticmethod
    def capacity_of(params) -> int | None:
        """The most nodes it proposes with `params` (None: as many as the budget allows); a method with
        total_tokens: null gets 1 + the sum of its parts' capacities."""
        return None

    def reset(self, prefill: PrefillInfo) -> None:
        pass

    def update(self, step: StepFeedback) -> None:
        pass

    def update_steps(self, step: StepFeedback) -> Generator:
        """update() as a generator of its model calls (graft/drafter.py: Drafter.update_steps); by default none."""
        self.update(step)
        return
        yield  # a generator

    def share_with(self, first: "Proposer") -> None:
        """In a batch, slot b's part and slot 0's (the same method): a part whose state the batch shares takes
        slot 0's (Token Recycling with table: shared); nothing by default, so each sequence keeps its own."""


class DraftSource(Proposer, ABC):
    """Drafts a tree from a model. `splits` names the budget splits it can honour."""

    needs = TargetNeeds()
    splits: tuple[str, ...] = ("dense",)

    @abstractmethod
    def draft(self, state: SequenceState, split: "Split", total_tokens: int) -> Draft:
        """The source's tree for this step, following `split` within `total_tokens`."""

    def draft_steps(self, state: SequenceState, split: "Split", total_tokens: int) -> Generator:
        """draft() as a generator of its model calls (graft/drafter.py: Drafter.propose_steps); by default none."""
        return self.draft(state, split, total_tokens)
        yield  # a generator


class Split:
    """How many draft nodes a step keeps, decided from the draft's confidence while it is drafted.

    Per step: start(); the source calls stop_after(level, frontier scores) after each expansion level and
    stops when it returns True; keep(candidate scores, total_tokens) -> draft tokens to keep, root
    included; label() names the step's stage for the records (None: nothing to record).

    A split that `supports_fixed_size` can run with `fixed_size = True` (graft/fixed_size.py): stop_after then
    never stops, keep() returns a 0-d tensor, level_cap() the deepest level whose candidates count, and label()
    a graft.fixed_size.Deferred, so that no decision is read back to the host."""

    supports_fixed_size = False
    fixed_size = False
    time_share = 1.0  # what of the seconds it times are this sequence's (a batch drafting in lockstep: 1 / slots)

    def level_cap(self) -> Tensor | None:
        return None

    def prepare(self, target: TargetBackend, total_tokens: int, batch_size: int = 1) -> None:
        """Once the drafter is built on `target`: a split that reads the target's costs gets them here, at the
        run's `batch_size` (the sequences one verify forward holds)."""

    def start(self) -> None:
        pass

    def stop_after(self, level: int, frontier_scores: Tensor) -> bool:
        return False

    def keep(self, scores: Tensor, total_tokens: int) -> int:
        return total_tokens

    def label(self) -> str | None:
        return None

    def levels_needed(self, total_tokens: int) -> int | None:
        """Expansion levels after which drafting on cannot change this split's tree for `total_tokens` (its
        checkpoint at that level still runs); None where any level can. A draft node at tree depth d is kept
        only with its d - 1 ancestors (they score at least as high and come first), so with at most m draft
        nodes kept nothing deeper than m counts: m - 1 levels below the root's children."""
        return None

    def widest_useful(self, total_tokens: int) -> int | None:
        """The frontier width past which a wider one cannot change the tree, for a split that reads neither
        the frontier nor candidates beyond the kept ones; None otherwise. Keeping the best m of the candidates
        expanded with a frontier of m nodes and m children each finds the best m nodes of the whole tree (each
        of them and its parent rank below m at their level), so a top_k above m only adds candidates that are
        never kept, up to exactly tied scores."""
        return None


class DenseSplit(Split):
    supports_fixed_size = True  # keep() is the whole budget: nothing to decide

    def levels_needed(self, total_tokens: int) -> int:
        return max(total_tokens - 2, 0)

    def widest_useful(self, total_tokens: int) -> int:
        return max(total_tokens - 1, 1)


register("split", "dense", description="keep the best total_tokens - 1 draft nodes")(lambda params: DenseSplit())


class Retriever(Proposer, ABC):
    """Proposes tokens without a model. `reads_at_any_token`: it can read a chain below any draft node (the
    attach policies that continue the draft's leaves need one). `supports_fixed_size`: retrieve(room=None) returns
    a subtree whose size does not depend on the data, from device tensors only (fixed-size trees)."""

    reads_at_any_token = False
    needs = TargetNeeds()  # what it reads from the target beyond the verification logits

    @abstractmethod
    def retrieve(self, state: SequenceState, anchor_token, room: int | None, tree_nodes: int) -> Retrieved | None:
        """A subtree below `anchor_token` worth up to `room` new nodes in a tree of `tree_nodes` nodes
        (room None: the retriever's fixed-size read)."""

    def chain_at(self, state: SequenceState, path: Tensor, length: int) -> Retrieved | None:
        """A chain of up to `length` nodes below a draft node (node 0: that node's token, path[-1]), read as
        if the text were the committed tokens followed by `path`, the draft tokens [d] from the root's child
        down to the node. None: nothing found."""
        return None

    def read_steps(self, state: SequenceState, anchor_token, room: int | None, tree_nodes: int) -> Generator:
        """retrieve() at the root as a generator of the calls it makes, so a batch reads every slot's at once
        (graft/drafter.py: run_calls), for a retriever whose read depends on room + tree_nodes alone (what
        stays the same while an attach policy grafts at the root); None: it reads when the policy grafts."""
        return None
        yield  # a generator

    def note(self) -> dict:
        """What the retriever wants recorded about its last retrieval (e.g. the suffix match length)."""
        return {}


@dataclass
class Retrieval:
    """The retrieve step's output: the step's retrievers (in method.retrieval's order) over the sequence as it
    stands. How much each may add depends on the room the draft and the earlier ones left, so their reads run
    where the attach policy grafts: `below` a subtree under a token, `chain_below` a chain under a draft node."""

    retrievers: list[Retriever]
    state: SequenceState
    # reads made at the root before grafting (Retriever.read_steps: a batch makes every slot's at once), by
    # retriever, with the room + tree nodes they were made for
    root_reads: dict = field(default_factory=dict)
    read_s: float = 0.0  # their seconds (this sequence's share)

    def below(self, retriever: Retriever, anchor_token, room: int | None, tree_nodes: int) -> Retrieved | None:
        return retriever.retrieve(self.state, anchor_token, room, tree_nodes)

    def made(self, retriever: Retriever, node: int, room: int | None, tree_nodes: int) -> Retrieved | None:
        """The read `below` would make at tree node `node`, where it was made before grafting (the root)."""
        made = self.root_reads.get(id(retriever)) if node == 0 else None
        if made is not None and made[0] == (None if room is None else room + tree_nodes):
            return made[1]
        return None

    def chain_below(self, retriever: Retriever, path: Tensor, length: int) -> Retrieved | None:
        return retriever.chain_at(self.state, path, length)


class AttachPolicy(ABC):
    """Where retrieved subtrees join the draft: place(grafted, retrieval) reads the retrievers at the policy's
    anchors (the root, the tail, the leaves) and grafts what they find until grafted.room is spent."""

    needs_reader = False  # it reads chains below arbitrary draft nodes (a retriever with reads_at_any_token)
    reads_root = False  # it grafts below the root: the reads there can be made before it places (read_steps)
    supports_fixed_size = False  # it can fill a fixed-size Grafted (room a tensor, no host reads)

    @abstractmethod
    def place(self, grafted: Grafted, retrieval: Retrieval) -> None:
        """Retrieve at the policy's anchors and graft what is found onto `grafted` (Grafted.add_subtree)."""


class Trim(ABC):
    """Cuts the united tree before it is verified: start() when the step's drafting begins, cut(tree, state)
    -> an ancestor-closed subset of its nodes (root first, the order kept), observe(step) after the
    verification of what it kept. A trim reads the tree on the host (no fixed-size trees)."""

    time_share = 1.0  # what of the seconds it times are this sequence's (a batch drafting in lockstep: 1 / slots)

    def prepare(self, target: TargetBackend, total_tokens: int, batch_size: int = 1) -> None:
        """Once the drafter is built on `target`: a trim that reads the target's costs gets them here, at the
        run's `batch_size` (the sequences one verify forward holds)."""

    def start(self) -> None:
        pass

    @abstractmethod
    def cut(self, tree: DraftTree, state: SequenceState) -> DraftTree:
        """The nodes of `tree` worth verifying this step."""

    def observe(self, step: StepFeedback, update_ms: float) -> None:
        """After the verification: what was accepted of the cut tree, and what the drafter's update took."""

    def note(self) -> dict:
        return {}
