"""Drafts composed from parts: a draft source, a budget split, retrievers and an attach policy.

One step of a composed drafter (`ComposedDrafter.propose`), in the words of the Graft paper:

1. draft, prune  - `draft(state) -> Draft`: the source drafts a tree; the split watches its confidence as it
                   is drafted, may stop it early, and says how many of the `total_tokens` nodes the draft keeps;
2. retrieve      - `retrieval_over(state)`: each retriever proposes subtrees from what the sequence and earlier
                   verifications taught it (no model), read where the attach policy asks (root reads are made
                   ahead, `retrieve_steps`, so a batch makes every slot's at once);
3. graft         - `graft(draft, retrieval) -> Proposal`: the attach policy (`AttachPolicy.place`) reads them at
                   its anchors (root, leaves, tail) and grafts them (`Grafted.add_subtree`) within the room the
                   draft left; duplicates merge and free their slots;
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
from dataclasses import dataclass
from typing import Generator, Literal

import torch

from graft.backends.target import TargetBackend
from graft.drafter import Drafter, PrefillInfo, Proposal, SequenceState, StepFeedback, StepNote, TargetNeeds, drive
from graft.fixed_size import Deferred, compact
from graft.grafting import Grafted
from graft.ops import read_count
from graft.parts import AttachPolicy, DenseSplit, Draft, DraftSource, Retrieval, Retriever, Split, Trim
from graft.registry import MethodConfig, build_part, part, register
from graft.schema import ConfigError
from graft.tree import DraftTree, NodeSource

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
        if self.total_tokens is not None and self.total_tokens < 2:  # the root alone drafts nothing: that is AR
            raise ConfigError(
                f"method.total_tokens={self.total_tokens} is not allowed; expected an integer >= 2, the root and at "
                "least one drafted node (null: what the parts can fill; method=ar decodes without drafting)"
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
        # split auto and trim auto measure (or load) the target's costs: last, so a refused config costs no measuring
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

    def retrieval_over(self, state: SequenceState) -> Retrieval:
        """The retrievers over the sequence as it stands (what earlier verifications taught them), ready to be
        read at the anchors the attach policy chooses (their reads happen in graft(), or at the root beforehand
        in retrieve_steps)."""
        return Retrieval(self.retrievers, state)

    def retrieve_steps(self, state: SequenceState, draft: Draft) -> Generator:
        """retrieval_over(), with the reads the attach policy will make at the root made now, as calls
        (Retriever.read_steps), so a batch makes every slot's at once."""
        retrieval = self.retrieval_over(state)
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
        note = StepNote(stage=draft.stage)
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
            note = self._retrieval_note(note, draft.tree, grafted, started)
        if self.params.refill:
            note = note.said(refilled_nodes=self._refill(draft, grafted))
        return Proposal(self._bucketed(grafted.finish(total)), note)

    def trimmed(self, united: Proposal, state: SequenceState) -> Proposal:
        """Trim: the nodes of the united tree worth verifying on this device (method.trim; none keeps them all)."""
        if self.trim is None:
            return united
        tree = self.trim.cut(united.tree, state)
        note = united.note.said(**self.trim.note(), trimmed_nodes=united.tree.num_nodes - tree.num_nodes)
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
        self.attach_policy.place(grafted, self.retrieval_over(state))
        note = self._retrieval_note(StepNote(), bare, grafted, started)
        if grafted.added:
            return Proposal(grafted.tree, note.said(stage="retrieval"))
        draft = yield from self.source.draft_steps(state, self.split, self.params.total_tokens)
        return Proposal(draft.tree, note.said(stage="draft", draft_nodes=draft.tree.num_nodes - 1))

    def _retrieval_note(self, note: StepNote, draft: DraftTree, grafted: Grafted, started: float) -> StepNote:
        if grafted.fixed_size:
            note = note.said(
                draft_nodes=Deferred((draft.tokens >= 0).sum() - 1),
                retrieved_nodes=Deferred(torch.as_tensor(grafted.added)),
                merged_nodes=Deferred(torch.as_tensor(grafted.merged)),
            )
        else:
            note = note.said(
                draft_nodes=draft.num_nodes - 1, retrieved_nodes=grafted.added, merged_nodes=grafted.merged
            )
        for retriever in self.retrievers:
            note = note.said(**retriever.note())
        return note.said(retrieval_ms=1e3 * (time.perf_counter() - started))

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
        share of their seconds); their seconds count in the step's retrieval_ms."""
        if self.retrievers:
            seconds = 0.0
            for retriever in self.retrievers:
                started = time.perf_counter()
                share = yield from retriever.update_steps(step)
                seconds += share if share is not None else time.perf_counter() - started
            note = step.proposal.note
            note.retrieval_ms = (note.retrieval_ms or 0.0) + 1e3 * seconds
