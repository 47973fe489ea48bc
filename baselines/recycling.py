"""Token Recycling (arXiv 2408.08696) as a retriever: the successor table, refreshed from every
verification, read through a static rank template rooted at a token. Method `recycling` is this
retriever alone (an 80-node template); Graft grafts it onto the pruned draft."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Literal

import torch

from graft.drafter import PrefillInfo, SequenceState, StepFeedback, TargetNeeds, drive
from graft.parts import Retrieved, Retriever
from graft.registry import register
from graft.retrieval.recycling import DEFAULT_RANK_PRIOR, Recycler, TableUpdate, TemplateRead


@dataclass
class RecyclingParams:
    table_k: int = 8  # successors per token in the table
    template_depth: int = 8  # deepest template node below its anchor
    rank_prior: list[float] = field(default_factory=lambda: list(DEFAULT_RANK_PRIOR))
    # how the table starts each sequence: "bigrams" (the prompt's bigrams, then the target's top-k after
    # the last prompt token) or "prefill" (the target's top-k after every prompt position, from the
    # prefill's logits: the paper's form; costs the LM head over the whole prompt)
    cold_start: Literal["bigrams", "prefill"] = "bigrams"
    # per_sequence: a fresh table for every sequence; shared: one table for the run (with run.batch_size > 1, for
    # the whole batch), seeded by every new prompt and learning from every verification, never cleared
    table: Literal["per_sequence", "shared"] = "per_sequence"

    def __post_init__(self):
        if not 1 <= self.table_k <= len(self.rank_prior) or self.template_depth < 1:
            raise ValueError(
                f"need 1 <= table_k <= len(rank_prior)={len(self.rank_prior)} and template_depth >= 1; got {self.table_k}, {self.template_depth}"
            )


@register(
    "retriever", "recycling", params=RecyclingParams, description="Token Recycling: successor table + static template"
)
class RecyclingRetriever(Retriever):
    reads_at_any_token = True
    supports_fixed_size = True  # retrieve(room=None) reads a fixed-size template (fixed-size trees)

    def __init__(self, params: RecyclingParams, target, budget: int):
        self.recycler = Recycler(
            target.vocab_size, params.table_k, params.template_depth, params.rank_prior, target.device, target.ops
        )
        self.read_limit = 2 * budget + 1  # merges free slots, so read further than the room, within reason
        self.shared = params.table == "shared"
        if params.cold_start == "prefill":
            self.needs = TargetNeeds(prompt_successors=params.table_k)

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        state = prefill.state
        self.recycler.reset(
            state.tokens[: state.prompt_len], prefill.forward.logits, prefill.forward.successors, clear=not self.shared
        )

    def share_with(self, first: Retriever) -> None:
        if self.shared:  # the batch's slots read and teach one table
            self.recycler = first.recycler
        else:  # each its own table, all in one tensor: a batch reads and teaches them together
            first.recycler.table.join(self.recycler.table)
            self.recycler.templates = first.recycler.templates  # built once for the batch, on any slot's read

    def read_size(self, room: int | None, tree_nodes: int) -> int:
        return self.read_limit if room is None else min(room + tree_nodes, self.read_limit)

    def retrieve(self, state: SequenceState, anchor_token, room: int | None, tree_nodes: int) -> Retrieved:
        return Retrieved(*self.recycler.subtree(anchor_token, self.read_size(room, tree_nodes)))

    def read_steps(self, state: SequenceState, anchor_token, room: int | None, tree_nodes: int) -> Generator:
        return Retrieved(*(yield TemplateRead(self.recycler, anchor_token, self.read_size(room, tree_nodes))))

    def chain_at(self, state: SequenceState, path, length: int) -> Retrieved:
        # the table is keyed by one token: the path above the node does not change what follows it
        return Retrieved(*self.recycler.subtree(path[-1], length, shape="chain"))

    def update(self, step: StepFeedback) -> None:
        drive(self.update_steps(step))

    def update_steps(self, step: StepFeedback) -> Generator:
        """One TableUpdate (a batch teaches every slot's table in one scatter); returns its share of the seconds."""
        acceptance = step.acceptance
        return (
            yield TableUpdate(self.recycler, step.tree.tokens, step.forward.logits, acceptance.path, acceptance.index)
        )
