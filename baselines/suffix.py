"""Suffix-automaton retrieval (the dynamic half of SAM-Decoding, arXiv 2411.10666) as a retriever:
continue the longest suffix of prompt + output that occurred earlier with what followed it there.
Method `suffix` is this retriever alone; `samd` switches between it and the EAGLE-3 tree."""

from __future__ import annotations

from dataclasses import dataclass

from graft.drafter import PrefillInfo, SequenceState
from graft.parts import Retrieved, Retriever
from graft.registry import register
from graft.retrieval.suffix import SuffixAutomaton


@dataclass
class SuffixParams:
    suffix_tokens: int = 16  # longest retrieved continuation
    suffix_min_match: int = 1  # shortest match that counts

    def __post_init__(self):
        if self.suffix_tokens < 1 or self.suffix_min_match < 1:
            raise ValueError(
                f"need suffix_tokens >= 1 and suffix_min_match >= 1; got {self.suffix_tokens}, {self.suffix_min_match}"
            )


@register(
    "retriever",
    "suffix",
    params=SuffixParams,
    description="suffix automaton over prompt + output, longest earlier match",
)
class SuffixRetriever(Retriever):
    reads_at_any_token = True  # below a draft node: the automaton walked along the node's path

    def __init__(self, params: SuffixParams, target, budget: int):
        self.params, self.device = params, target.device
        self._match: int | None = None

    @staticmethod
    def capacity_of(params: SuffixParams) -> int:
        return params.suffix_tokens

    def reset(self, prefill: PrefillInfo) -> None:
        self.automaton = SuffixAutomaton()

    def retrieve(self, state: SequenceState, anchor_token, room: int, tree_nodes: int) -> Retrieved | None:
        self.automaton.sync(state.tokens)
        self._match, found = self.automaton.continuation(
            min(self.params.suffix_tokens, room), self.params.suffix_min_match
        )
        return Retrieved.chain_of(int(anchor_token), found, self.device) if found else None

    def chain_at(self, state: SequenceState, path, length: int) -> Retrieved | None:
        self.automaton.sync(state.tokens)
        tokens = path.tolist()
        self._match, found = self.automaton.continuation_after(
            tokens, min(self.params.suffix_tokens, length - 1), self.params.suffix_min_match
        )
        return Retrieved.chain_of(tokens[-1], found, self.device) if found else None

    def note(self) -> dict:
        match, self._match = self._match, None
        return {} if match is None else {"match": match}
