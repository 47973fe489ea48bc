"""Prompt-lookup decoding (PLD): find the latest earlier occurrence of the context's last n-gram
(n from `max_ngram` down to `min_ngram`) in prompt + output, and propose the tokens that followed it
as a chain. The n-gram index is kept incrementally, so a step costs O(new tokens), not O(context).
"""

from __future__ import annotations

from dataclasses import dataclass

from graft.drafter import Drafter, PrefillInfo, SequenceState, register
from graft.tree import DraftTree, NodeSource


@dataclass
class PLDParams:
    max_ngram: int = 3
    min_ngram: int = 1
    num_pred_tokens: int = 10

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_pred_tokens < 1:
            raise ValueError(f"num_pred_tokens must be >= 1, got {self.num_pred_tokens}")


@register("pld", params=PLDParams, description="prompt lookup: continue the latest earlier match of the last n-gram")
class PromptLookupDrafter(Drafter):
    params: PLDParams

    def reset(self, prefill: PrefillInfo) -> None:
        self._last_end: dict[tuple[int, ...], int] = {}  # n-gram -> position of its last token, latest wins
        self._indexed = 0  # positions [0, _indexed) are in the index

    def _index_until(self, tokens: list[int], end: int) -> None:
        for pos in range(self._indexed, end):
            for n in range(self.params.min_ngram, self.params.max_ngram + 1):
                if pos + 1 >= n:
                    self._last_end[tuple(tokens[pos + 1 - n : pos + 1])] = pos
        self._indexed = max(self._indexed, end)

    def propose(self, state: SequenceState) -> DraftTree:
        tokens = state.tokens
        last = len(tokens) - 1
        self._index_until(tokens, last)  # every position but the root, so the root's n-gram is not its own match
        for n in range(self.params.max_ngram, self.params.min_ngram - 1, -1):
            if last + 1 < n:
                continue
            end = self._last_end.get(tuple(tokens[last + 1 - n :]))
            if end is not None:
                continuation = tokens[end + 1 : end + 1 + self.params.num_pred_tokens]
                return DraftTree.chain(state.root, continuation, NodeSource.RETRIEVAL, device=self.target.device)
        return DraftTree.root_only(state.root, device=self.target.device)

    def max_nodes(self) -> int:
        return 1 + self.params.num_pred_tokens
