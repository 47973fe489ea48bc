"""The drafter protocol: what the decode loop calls, what a drafter reads, what it needs from the target.

Per sequence the loop calls:

    reset(prefill)                  once, after the target's prefill
    propose(state) -> Proposal      before each verification (the draft phase)
    update(step)                    after acceptance, when another step follows (the extend phase)

A drafter declares `needs`: the target's hidden states it reads (taps), and whether it uses the target's
embeddings and LM head (through `target.embed` / `target.lm_head`, never the model's modules). The loop
asks the target for the taps on this drafter's forwards only, so the baseline never computes them.
Methods are composed from parts (graft/compose.py); a drafter written from scratch subclasses Drafter
and registers itself with `graft.registry.register("drafter", name, params)`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Generator

import torch
from torch import Tensor

from graft.acceptance import Acceptance
from graft.backends.target import ForwardOutput, HiddenTap, TargetBackend
from graft.ops import upload
from graft.tree import DraftTree, Topology


@dataclass(frozen=True)
class TargetNeeds:
    taps: tuple[HiddenTap, ...] = ()  # hidden states read from the prefill and every verification
    embeddings: bool = False  # target.embed
    lm_head: bool = False  # target.lm_head
    prompt_successors: int = 0  # the prefill's top-k next tokens at every prompt position (ForwardOutput.successors)

    def __or__(self, other: "TargetNeeds") -> "TargetNeeds":
        taps = self.taps + tuple(t for t in other.taps if t not in self.taps)
        return TargetNeeds(
            taps,
            self.embeddings or other.embeddings,
            self.lm_head or other.lm_head,
            max(self.prompt_successors, other.prompt_successors),
        )


@dataclass
class SequenceState:
    """What a drafter may read: every committed token id (prompt first); the last one is the next root."""

    tokens: list[int]
    prompt_len: int
    root_id: Tensor | None = None  # [1] the root token on the drafting device, when the loop has it there

    @property
    def root(self) -> int:
        return self.tokens[-1]

    def root_here(self, device) -> int | Tensor:
        """The root as the loop holds it: [1] on `device` where it left it there, else the id (no copy up)."""
        if self.root_id is not None and self.root_id.device == torch.device(device):
            return self.root_id
        return self.root

    def root_on(self, device) -> Tensor:
        """[1] the root token on `device`, without a host-to-device copy when the loop left it there."""
        if self.root_id is not None and self.root_id.device == torch.device(device):
            return self.root_id
        return upload([self.root], device)


@dataclass
class PrefillInfo:
    state: SequenceState
    forward: ForwardOutput  # logits of the last prompt position; the drafter's taps at every prompt position


@dataclass
class StepNote:
    """A drafter's note on one step, stored in the step's record (`step_info`: the fields it set, in this order).
    Counts are nodes without the root; on fixed-size trees a count or the stage may be a Deferred, read back once
    at the sequence's end (graft/fixed_size.py)."""

    stage: object = None  # the pruning stage that fired (check@<levels>) or dense; switch: retrieval | draft
    draft_nodes: object = None
    retrieved_nodes: object = None
    merged_nodes: object = None  # retrieved nodes the draft already held
    match: int | None = None  # the suffix retriever's match length
    refilled_nodes: int | None = None  # the draft's next-best candidates in the room retrieval left
    trim_expected: float | None = None  # the trim's expected tokens per step at its size (trim auto)
    trimmed_nodes: int | None = None
    fitted_to_context: int | None = None  # the tree was cut to the positions left in the context
    retrieval_ms: float | None = None  # the retrievers' reads, the grafting, and the tables' refresh after the step

    def said(self, **values) -> "StepNote":
        """This note with `values` set (a part's own note: Retriever.note, Trim.note)."""
        return dataclasses.replace(self, **values)

    def record(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass
class Proposal:
    """The draft phase's output: the tree to verify and the drafter's note on the step."""

    tree: DraftTree
    note: StepNote = field(default_factory=StepNote)


@dataclass
class StepFeedback:
    proposal: Proposal  # update() may add to proposal.note; the loop records it after update
    topology: Topology
    forward: ForwardOutput  # [num_nodes, vocab] logits; the drafter's taps [num_nodes, taps * hidden]
    acceptance: Acceptance
    state: SequenceState  # already extended with the committed tokens

    @property
    def tree(self) -> DraftTree:
        return self.proposal.tree


class Drafter(ABC):
    """The protocol. Subclasses implement propose(); reset() and update() default to nothing."""

    needs: TargetNeeds = TargetNeeds()
    lockstep = 1  # the sequences drafting with it in lockstep this step (graft/batch.py sets it; timed parts share)

    def __init__(self, target: TargetBackend, method=None, batch_size: int = 1):
        self.target = target
        self.method = method  # the validated graft.registry.MethodConfig it was built from (None in tests)
        # the sequences one verify forward holds in the run (run.batch_size): what a cost-aware part's profile
        # is measured at (graft/methods/auto_budget.py); decoding itself does not read it
        self.batch_size = batch_size

    def max_nodes(self) -> int:
        """Most nodes a proposed tree can have, root included (sizes the target's cache)."""
        return 1

    def reset(self, prefill: PrefillInfo) -> None:
        pass

    @abstractmethod
    def propose(self, state: SequenceState) -> Proposal:
        """The tree to verify next, rooted at state.root."""

    def propose_steps(self, state: SequenceState) -> Generator:
        """propose() as a generator of the model calls it makes (each with `run()` and a `run_all(calls)` that
        runs several sequences' calls as one), so a batch (graft/batch.py) drafts every slot in lockstep; it
        returns the Proposal. By default it makes none: propose() itself."""
        return self.propose(state)
        yield  # a generator

    def update(self, step: StepFeedback) -> None:
        pass

    def update_steps(self, step: StepFeedback) -> Generator:
        """update() as a generator of its model calls, as propose_steps is propose(): a batch extends every slot's
        drafter in lockstep (one head forward for every slot's accepted tokens). By default it makes none."""
        self.update(step)
        return
        yield  # a generator

    def share_with(self, first: "Drafter") -> None:
        """In a batch (graft/batch.py), called on slot b's drafter with slot 0's: state the method shares across
        the batch is taken from it; by default every sequence keeps its own."""


def drive(steps: Generator):
    """Run a drafting generator alone: each call it yields run as it comes (`call.run()`); returns its value."""
    try:
        call = next(steps)
        while True:
            call = steps.send(call.run())
    except StopIteration as done:
        return done.value


def run_calls(calls: list) -> list:
    """Several sequences' pending calls, each kind's together (`type(call).run_all`), results in order."""
    return run_grouped(calls, type, lambda group: type(group[0]).run_all(group))


def run_grouped(calls: list, key: Callable, run: Callable[[list], list]) -> list:
    """run(group) for each group of the calls with one key(call), in their first call's order; results in the
    calls' order (a call kind's run_all: the calls that can run as one)."""
    groups: dict = {}
    for i, call in enumerate(calls):
        groups.setdefault(key(call), []).append(i)
    results: list = [None] * len(calls)
    for mine in groups.values():
        for i, result in zip(mine, run([calls[i] for i in mine])):
            results[i] = result
    return results
