"""Prompt-lookup decoding (PLD) as a retriever: find the latest earlier occurrence of the context's last
n-gram (n from `max_ngram` down to `min_ngram`) in prompt + output, and propose the tokens that followed
it as a chain. The n-gram index is kept incrementally, so a step costs O(new tokens), not O(context).
Method `pld` (configs/method/pld.yaml) is this retriever alone at the root."""

from __future__ import annotations

from dataclasses import dataclass

from graft.drafter import PrefillInfo, SequenceState
from graft.parts import Retrieved, Retriever
from graft.registry import register


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


def ngram_continuation(last_end: dict, tokens: list[int], min_ngram: int, max_ngram: int, length: int) -> list[int]:
    """What followed the latest earlier occurrence of the longest matching final n-gram (longest n first)."""
    last = len(tokens) - 1
    for n in range(max_ngram, min_ngram - 1, -1):
        if last + 1 < n:
            continue
        end = last_end.get(tuple(tokens[last + 1 - n :]))
        if end is not None:
            return tokens[end + 1 : end + 1 + length]
    return []


@register(
    "retriever",
    "pld",
    params=PLDParams,
    description="prompt lookup: continue the latest earlier match of the last n-gram",
)
class PromptLookup(Retriever):
    reads_at_any_token = True  # below a draft node: the n-grams ending at the node, over text + its path

    def __init__(self, params: PLDParams, target, budget: int):
        self.params, self.device = params, target.device

    @staticmethod
    def capacity_of(params: PLDParams) -> int:
        return params.num_pred_tokens

    def reset(self, prefill: PrefillInfo) -> None:
        self._last_end: dict[tuple[int, ...], int] = {}  # n-gram -> position of its last token, latest wins
        self._indexed = 0  # positions [0, _indexed) are in the index

    def _index_until(self, tokens: list[int], end: int) -> None:
        for pos in range(self._indexed, end):
            for n in range(self.params.min_ngram, self.params.max_ngram + 1):
                if pos + 1 >= n:
                    self._last_end[tuple(tokens[pos + 1 - n : pos + 1])] = pos
        self._indexed = max(self._indexed, end)

    def retrieve(self, state: SequenceState, anchor_token, room: int, tree_nodes: int) -> Retrieved | None:
        p = self.params
        self._index_until(state.tokens, len(state.tokens) - 1)  # every position but the root: not its own match
        found = ngram_continuation(self._last_end, state.tokens, p.min_ngram, p.max_ngram, min(p.num_pred_tokens, room))
        return Retrieved.chain_of(state.root, found, self.device) if found else None

    def chain_at(self, state: SequenceState, path, length: int) -> Retrieved | None:
        p = self.params
        self._index_until(state.tokens, len(state.tokens) - 1)
        tokens = path.tolist()
        # the index holds committed positions before the root, so every match continues in the text itself
        found = ngram_continuation(
            self._last_end, state.tokens + tokens, p.min_ngram, p.max_ngram, min(p.num_pred_tokens, length - 1)
        )
        return Retrieved.chain_of(tokens[-1], found, self.device) if found else None
