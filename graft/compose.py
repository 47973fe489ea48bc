"""Drafts composed from parts: a draft source, a budget split, retrievers and an attach policy.

One step of a composed drafter (`ComposedDrafter.propose`), in the words of the Graft paper:

1. draft, prune  - `draft(state) -> Draft`: the source drafts a tree; the split watches its confidence as it
                   is drafted, may stop it early, and says how many of the `total_tokens` nodes the draft keeps;
2. retrieve      - each retriever proposes a subtree from what the sequence and earlier verifications
3. and graft       taught it (no model); `retrieve_and_graft(draft, state) -> Proposal`: the attach policy
                   (`AttachPolicy.place`) asks for them at its anchors (root, leaves, tail) and grafts them
                   (`Grafted.add_subtree`) within the room the draft left; duplicates merge and free their slots;
4. trim          - `trimmed(proposal, state) -> Proposal` (beyond the paper, below);
5. verify        - the decode loop verifies the united tree; update() then lets every part learn from the
                   verification (the head encodes the accepted tokens, the tables refresh).

Beyond the paper, `trim` may cut the united tree before it is verified (trim auto: to the size with the most
expected tokens per millisecond on this device, graft/methods/auto_budget.py); total_tokens is then a cap.

`combine: switch` is SAM-Decoding's rule instead: use the retrieved subtree alone when a retriever finds
one, otherwise the draft. EAGLE-3 is source eagle + split dense; the pruned tree adds split stage; Graft
adds retrieval [recycling] at the root; Token Recycling, PLD and suffix retrieval have no source.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Generator, Literal

import torch
from torch import Tensor

from graft.backends.target import TargetBackend
from graft.drafter import Drafter, PrefillInfo, Proposal, SequenceState, StepFeedback, TargetNeeds, drive
from graft.fixed_size import Deferred
from graft.grafting import Grafted
from graft.fixed_size import compact
from graft.ops import read_count, upload
from graft.registry import MethodConfig, build_part, part, register
from graft.schema import ConfigError
from graft.tree import DraftTree, NodeSource


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


RETRIEVAL_ALIASES = {"both": ["suffix", "recycling"]}  # the original two-retriever form of method.retrieval


@dataclass
class ComposeParams:
    total_tokens: int | None = None  # verified nodes per step, root included; None: what the parts can fill
    source: str | None = None  # a draft source; None: retrieval only
    split: str = "dense"
    retrieval: list[str] | str = ()  # retrievers, in the order their subtrees are grafted ("both" = suffix, recycling)
    attach: str = "root"
    combine: Literal["graft", "switch"] = "graft"
    # beyond the paper: the draft's next-best candidates (already scored while drafting) fill the slots that
    # retrieval left empty (unknown table entries, merges), so a step verifies its whole budget
    refill: bool = False
    # beyond the paper: a trim cutting the united tree before verification (none | auto)
    trim: str = "none"

    def __post_init__(self):
        if isinstance(self.retrieval, str):
            self.retrieval = RETRIEVAL_ALIASES.get(self.retrieval, [self.retrieval] if self.retrieval != "none" else [])
        self.retrieval = list(self.retrieval)
        if self.total_tokens is not None and self.total_tokens < 1:
            raise ConfigError(
                f"method.total_tokens={self.total_tokens} is not allowed; expected an integer >= 1 (null: what the parts can fill)"
            )


@register("drafter", "composed", params=ComposeParams, description="source + split + retrievers + attach policy")
class ComposedDrafter(Drafter):
    @staticmethod
    def components(p: ComposeParams) -> list[tuple[str, str, str]]:
        """(kind, part name, method key) of every part these params compose."""
        parts = [("source", p.source, "source"), ("split", p.split, "split")] if p.source else []
        if p.retrieval:
            parts.append(("attach", p.attach, "attach"))
        if p.trim != "none":
            parts.append(("trim", p.trim, "trim"))
        return parts + [("retriever", name, "retrieval") for name in p.retrieval]

    @staticmethod
    def check(method: MethodConfig) -> None:
        """Combinations the parts cannot honour, and the budget when total_tokens is null."""
        p: ComposeParams = method.params
        if p.source is None and p.split != "dense":
            raise ConfigError(f"method.split={p.split!r} needs a draft source (method.source)")
        if p.source is not None:
            splits = part("source", p.source).factory.splits
            if p.split not in splits:
                raise ConfigError(
                    f"method.source={p.source!r} can follow the splits {', '.join(splits)}, not method.split={p.split!r}"
                )
        if p.retrieval and part("attach", p.attach).factory.needs_reader:
            readers = [r for r in p.retrieval if part("retriever", r).factory.reads_at_any_token]
            if not readers:
                raise ConfigError(
                    f"method.attach={p.attach!r} continues draft leaves with chains read below any token; "
                    f"method.retrieval={p.retrieval} has no such retriever (add recycling)"
                )
        if p.refill and not (p.source and p.combine == "graft"):
            raise ConfigError(
                "method.refill=true fills the budget with the draft's next-best candidates; it needs a draft source "
                f"(method.source) and combine='graft', not source={p.source!r}, combine={p.combine!r}"
            )
        if p.combine == "switch" and not (p.source and p.retrieval):
            raise ConfigError("method.combine='switch' chooses between a draft source and retrieval; it needs both")
        if p.total_tokens is None:
            sizes = [
                part(kind, name).factory.capacity_of(method.of(kind, name))
                for kind, name, _ in ComposedDrafter.components(p)
                if kind in ("source", "retriever")
            ]
            if not sizes or None in sizes:
                raise ConfigError(
                    f"method {method.name}: set method.total_tokens (the verified nodes per step, root included)"
                )
            p.total_tokens = 1 + (max(sizes) if p.combine == "switch" else sum(sizes))
        drafted = part("source", p.source).factory.capacity_of(method.of("source", p.source)) if p.source else None
        if drafted is not None and drafted + 1 > p.total_tokens:
            raise ConfigError(
                f"method {method.name}: the {p.source} source drafts {drafted} nodes, more than "
                f"method.total_tokens={p.total_tokens} leaves after the root"
            )

    def __init__(self, target: TargetBackend, method: MethodConfig, batch_size: int = 1):
        super().__init__(target, method, batch_size)
        p: ComposeParams = method.params
        self.params = p
        self.source: DraftSource | None = build_part(method, "source", p.source, target) if p.source else None
        self.split: Split | None = build_part(method, "split", p.split) if p.source else None
        self.retrievers: list[Retriever] = [
            build_part(method, "retriever", name, target, p.total_tokens) for name in p.retrieval
        ]
        self.attach_policy: AttachPolicy | None = build_part(method, "attach", p.attach) if p.retrieval else None
        self.trim: Trim | None = build_part(method, "trim", p.trim) if p.trim != "none" else None
        self.needs = self.source.needs if self.source else TargetNeeds()
        for retriever in self.retrievers:
            self.needs = self.needs | retriever.needs
        target.check_taps(self.needs.taps)
        # fixed-size trees when the target asks for them and every part can keep its decisions on the device;
        # otherwise this method reads its decisions back each step (fine on a CPU, a few syncs on a GPU)
        parts = [part for part in (self.source, self.split, self.attach_policy, *self.retrievers) if part is not None]
        self.fixed_size = (
            target.fixed_size_trees
            and p.combine == "graft"
            and all(part.supports_fixed_size for part in parts)
            and not p.refill  # the refill reads the room left on the host
            and self.trim is None  # so does a trim
        )
        if self.split is not None:
            self.split.fixed_size = self.fixed_size
        # a fixed-size tree that pruning emptied is verified at its kept size, rounded up to a bucket (one small
        # read a step): the pruned baseline exists to verify fewer nodes, and on a MoE target each node costs
        self.bucket = (
            target.tree_bucket if self.fixed_size and not isinstance(self.split, (DenseSplit, type(None))) else 0
        )
        # budget=auto measures (or loads) the target's costs: last, so a refused config costs no measuring
        for costed in filter(None, (self.split, self.trim)):
            costed.prepare(target, p.total_tokens, batch_size=batch_size)

    def max_nodes(self) -> int:
        return self.params.total_tokens

    def share_with(self, first: Drafter) -> None:
        for mine, theirs in zip(self.retrievers, first.retrievers):
            mine.share_with(theirs)
        if self.source is not None:
            self.source.share_with(first.source)

    def reset(self, prefill: PrefillInfo) -> None:
        if self.source:
            self.source.reset(prefill)
        for retriever in self.retrievers:
            retriever.reset(prefill)

    def propose(self, state: SequenceState) -> Proposal:
        """One step's tree, in the paper's steps: draft (the split prunes it as the source drafts), retrieve and
        graft (the attach policy), then trim (beyond the paper). SAM-Decoding's switch chooses instead of uniting."""
        return drive(self.propose_steps(state))

    def propose_steps(self, state: SequenceState) -> Generator:
        for timed in (self.split, self.trim):  # a timed part's share of drafting done in lockstep with other slots
            if timed is not None:
                timed.time_share = 1.0 / self.lockstep
        if self.trim is not None:
            self.trim.start()  # the trim times the whole step's drafting
        if self.params.combine == "switch":
            united = yield from self._switch(state)
        else:
            draft = yield from self.draft_steps(state)
            united = self.graft(draft, (yield from self.retrieve_steps(state, draft)))
        return self.trimmed(united, state)

    def draft(self, state: SequenceState) -> Draft:
        """Draft and prune: the source's tree within the budget, cut where the split's confidence checks say (a
        bare root for the methods without a source)."""
        return drive(self.draft_steps(state))

    def draft_steps(self, state: SequenceState) -> Generator:
        if self.source is None:
            return Draft(self._bare_root(state))
        return (yield from self.source.draft_steps(state, self.split, self.params.total_tokens))

    def retrieve(self, state: SequenceState) -> Retrieval:
        """Retrieve: the retrievers over the sequence as it stands (what earlier verifications taught them)."""
        return Retrieval(self.retrievers, state)

    def retrieve_steps(self, state: SequenceState, draft: Draft) -> Generator:
        """retrieve(), with the reads the attach policy will make at the root made now, as calls
        (Retriever.read_steps), so a batch makes every slot's at once."""
        retrieval = self.retrieve(state)
        tree_nodes = draft.tree.num_nodes
        room = None if self.fixed_size else self.params.total_tokens - tree_nodes
        if not self.retrievers or not self.attach_policy.reads_root or (room is not None and room <= 0):
            return retrieval
        anchor = state.root_here(self.target.device)
        for retriever in self.retrievers:
            started = time.perf_counter()
            found = yield from retriever.read_steps(state, anchor, room, tree_nodes)
            if found is not None:
                retrieval.root_reads[id(retriever)] = (None if room is None else room + tree_nodes, found)
                retrieval.read_s += (time.perf_counter() - started) / self.lockstep
        return retrieval

    def graft(self, draft: Draft, retrieval: Retrieval) -> Proposal:
        """Graft: the attach policy reads the retrieval at its anchors and grafts what it finds into the room the
        draft left; the refill (beyond the paper) fills what retrieval left empty."""
        total = self.params.total_tokens
        note = {"stage": draft.stage} if draft.stage is not None else {}
        if not self.retrievers and not self.params.refill:
            return Proposal(self._bucketed(compact(draft.tree, total) if self.bucket else draft.tree), note)
        started = time.perf_counter() - retrieval.read_s  # the reads made at the root count too
        if self.fixed_size:
            filled = (draft.tree.tokens >= 0).sum()  # 0-d, on the device
            grafted = Grafted(draft.tree, total - filled, fixed_size=True)
        else:
            grafted = Grafted(draft.tree, total - draft.tree.num_nodes)
        if self.retrievers:
            self.attach_policy.place(grafted, retrieval)
            note.update(self._retrieval_note(draft.tree, grafted, started))
        if self.params.refill:
            note["refilled_nodes"] = self._refill(draft, grafted)
        return Proposal(self._bucketed(grafted.finish(total)), note)

    def trimmed(self, united: Proposal, state: SequenceState) -> Proposal:
        """Trim: the nodes of the united tree worth verifying on this device (method.trim; none keeps them all)."""
        if self.trim is None:
            return united
        tree = self.trim.cut(united.tree, state)
        note = {**united.note, **self.trim.note(), "trimmed_nodes": united.tree.num_nodes - tree.num_nodes}
        return Proposal(tree, note)

    def _bucketed(self, tree: DraftTree) -> DraftTree:
        """A compacted fixed-size tree (filled nodes first) cut to the smallest bucket that holds its filled nodes."""
        if not self.bucket:
            return tree
        kept = read_count((tree.tokens >= 0).sum())
        return tree.first(min(tree.num_nodes, -(-kept // self.bucket) * self.bucket))

    @staticmethod
    def _refill(draft: Draft, grafted: Grafted) -> int:
        """The draft's next-best candidates in the room retrieval left: the best (kept + room) are offered in
        candidate order, the kept ones and any already retrieved merging; while room is left (merges) the
        next best follow, until the candidates run out. Returns how many were added."""
        if draft.widen is None:
            return 0
        retrieved, wanted = grafted.added, draft.tree.num_nodes - 1
        while grafted.room > 0:
            wanted += grafted.room
            wider = draft.widen(wanted)  # [<= wanted + 1] nodes, the kept ones among them
            grafted.add_subtree(0, wider.tokens, wider.parents, source=NodeSource.DRAFT, scores=wider.scores)
            if wider.num_nodes <= wanted:  # every candidate offered
                break
        refilled = grafted.added - retrieved
        grafted.added = retrieved  # retrieval's count stays retrieval's
        return refilled

    def _bare_root(self, state: SequenceState) -> DraftTree:
        return DraftTree.root_only(state.root_on(self.target.device), self.target.device)

    def _switch(self, state: SequenceState) -> Generator:
        """SAM-Decoding: the retrieved subtree alone when there is one, else the draft."""
        started = time.perf_counter()
        bare = DraftTree.root_only(state.root, self.target.device)
        grafted = Grafted(bare, self.params.total_tokens - 1)
        self.attach_policy.place(grafted, self.retrieve(state))
        note = self._retrieval_note(bare, grafted, started)
        if grafted.added:
            return Proposal(grafted.tree, {"stage": "retrieval", **note})
        draft = yield from self.source.draft_steps(state, self.split, self.params.total_tokens)
        return Proposal(draft.tree, {"stage": "draft", **note, "draft_nodes": draft.tree.num_nodes - 1})

    def _retrieval_note(self, draft: DraftTree, grafted: Grafted, started: float) -> dict:
        if grafted.fixed_size:
            note = {
                "draft_nodes": Deferred((draft.tokens >= 0).sum() - 1),
                "retrieved_nodes": Deferred(torch.as_tensor(grafted.added)),
                "merged_nodes": Deferred(torch.as_tensor(grafted.merged)),
            }
        else:
            note = {
                "draft_nodes": draft.num_nodes - 1,
                "retrieved_nodes": grafted.added,
                "merged_nodes": grafted.merged,
            }
        for retriever in self.retrievers:
            note.update(retriever.note())
        note["graft_ms"] = 1e3 * (time.perf_counter() - started)
        return note

    def update(self, step: StepFeedback) -> None:
        drive(self.update_steps(step))

    def update_steps(self, step: StepFeedback) -> Generator:
        started = time.perf_counter()
        if self.source:
            yield from self.source.update_steps(step)
        yield from self._update_retrievers(step)
        if self.trim is not None:  # in lockstep the elapsed time holds every slot's calls: this slot's share
            self.trim.observe(step, 1e3 * (time.perf_counter() - started) * self.trim.time_share)

    def _update_retrievers(self, step: StepFeedback) -> Generator:
        """Every retriever learns from the verification (in lockstep where it yields calls: it returns its
        share of their seconds); their seconds count in graft_ms."""
        if self.retrievers:
            seconds = 0.0
            for retriever in self.retrievers:
                started = time.perf_counter()
                share = yield from retriever.update_steps(step)
                seconds += share if share is not None else time.perf_counter() - started
            step.proposal.note["graft_ms"] = step.proposal.note.get("graft_ms", 0.0) + 1e3 * seconds
