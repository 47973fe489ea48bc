"""SAM-Decoding's switch (arXiv 2411.10666) on EAGLE-3: each step, the suffix automaton's retrieved
continuation when its match is at least `min_match` tokens long, otherwise the EAGLE-3 dense tree. The
head catches up with the accepted tokens on every step, so it is ready whichever source is used."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft.drafter import PrefillInfo, SequenceState, register
from graft.methods.eagle3 import Eagle3Drafter, Eagle3Params, grow_tree
from graft.retrieval.suffix import SuffixAutomaton
from graft.tree import DraftTree, NodeSource


@dataclass
class SamdParams(Eagle3Params):
    min_match: int = 5
    num_pred_tokens: int = 16  # longest retrieved continuation (capped by total_tokens - 1)


@register("samd", params=SamdParams, description="SAM-Decoding switch: suffix retrieval when the match >= 5, else EAGLE-3")
class SamdDrafter(Eagle3Drafter):
    params: SamdParams

    @torch.inference_mode()
    def reset(self, prefill: PrefillInfo) -> None:
        super().reset(prefill)
        self.automaton = SuffixAutomaton()

    @torch.inference_mode()
    def propose(self, state: SequenceState) -> DraftTree:
        p = self.params
        last = self._catch_up()
        self.automaton.sync(state.tokens)
        length, continuation = self.automaton.continuation(min(p.num_pred_tokens, p.total_tokens - 1), p.min_match)
        self.last_info = {"stage": "retrieval" if continuation else "draft", "match": length}
        if continuation:
            return DraftTree.chain(state.root, continuation, NodeSource.RETRIEVAL, device=self.target.device)
        return grow_tree(self.head, self._embed, self.cache, last, state.root, p.total_tokens, p.depth, p.top_k)
