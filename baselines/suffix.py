"""Suffix-automaton retrieval alone (the dynamic half of SAM-Decoding): continue the longest suffix of
prompt + output that occurred earlier with what followed it there."""

from __future__ import annotations

from dataclasses import dataclass

from graft.drafter import Drafter, PrefillInfo, SequenceState, register
from graft.retrieval.suffix import SuffixAutomaton
from graft.tree import DraftTree, NodeSource


@dataclass
class SuffixParams:
    num_pred_tokens: int = 16
    min_match: int = 1

    def __post_init__(self):
        if self.num_pred_tokens < 1 or self.min_match < 1:
            raise ValueError(f"need num_pred_tokens >= 1 and min_match >= 1; got {self.num_pred_tokens}, {self.min_match}")


@register("suffix", params=SuffixParams, description="suffix automaton over prompt + output, longest earlier match")
class SuffixDrafter(Drafter):
    params: SuffixParams

    def max_nodes(self) -> int:
        return 1 + self.params.num_pred_tokens

    def reset(self, prefill: PrefillInfo) -> None:
        self.automaton = SuffixAutomaton()

    def propose(self, state: SequenceState) -> DraftTree:
        self.automaton.sync(state.tokens)
        length, continuation = self.automaton.continuation(self.params.num_pred_tokens, self.params.min_match)
        self.last_info = {"match": length}
        return DraftTree.chain(state.root, continuation, NodeSource.RETRIEVAL, device=self.target.device)
