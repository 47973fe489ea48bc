"""The lossless check: a method's tokens against the baseline's on the same prompt, and the one rule that may
excuse a divergence, a float tie: the baseline's top-2 logit gap at that position within a few units in the
last place, which batched and one-row products can produce from the same inputs. Every tool that checks
losslessness (the runner, `graft-report check-lossless`, the device check) decides here."""

from __future__ import annotations

import math

import torch

TIE_ULPS = {torch.float32: 16, torch.bfloat16: 4, torch.float16: 4}


def tie_ulps(dtype: torch.dtype, ulps: int | None = None) -> int:
    """The float-tie tolerance in ulps: `ulps` when the run sets one (run.float_tie_ulps), else the dtype's."""
    return TIE_ULPS.get(dtype, 16) if ulps is None else ulps


def float_tie(gap: float, top_logit: float, dtype: torch.dtype, ulps: int | None = None) -> bool:
    """A top-2 gap within `ulps` units in the last place of the top logit, in the logits' dtype: a
    difference that batched and one-row products can produce from the same inputs.

    Why the defaults differ. In float32 one ulp of a logit near 20 is 1.9e-6, and reordered sums move a
    logit by a few ulps, so 16 ulps (3e-5) covers reordering and nothing else. In bfloat16 the logits are
    rounded to 8 significant bits: one ulp at 20 is 0.125, so 16 ulps would be 2 logits, enough to excuse
    a real bug. There the rule is 4 ulps (0.5 at 20, 0.06 at 2). Where the 4 comes from: rounding the two
    logits themselves can put an exact tie up to 1 ulp apart, and the final hidden state, itself rounded
    to 8 bits before the LM head, moves each logit by a little more; the largest benign divergence seen in
    this suite's bfloat16 runs (batched tree verification against one-row decoding, same inputs) was 2 ulps,
    and 4 is twice that. A larger gap is reported as a divergence for a person to read, never excused; a
    float32 run of the same prompt settles any doubt."""
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(top_logit), 1e-30)))
    return gap <= tie_ulps(dtype, ulps) * ulp


def compare(method, baseline, dtype: torch.dtype, ulps: int | None) -> dict:
    """First position where the method's tokens differ from the baseline's (each a Conversation of graft/run/conversation.py),
    with the baseline's top-2 gap there and whether the float-tie rule excuses it."""
    for turn, (m, b) in enumerate(zip(method.turns, baseline.turns)):
        if m.new_tokens == b.new_tokens:
            continue
        position = next(
            (i for i, (x, y) in enumerate(zip(m.new_tokens, b.new_tokens)) if x != y),
            min(len(m.new_tokens), len(b.new_tokens)),
        )
        gap = b.top2_gaps[position] if position < len(b.top2_gaps) else None
        top = b.top_logits[position] if position < len(b.top_logits) else None
        return {
            "checked": True,
            "equal": False,
            "first_divergence": {
                "turn": turn,
                "position": position,
                "baseline_token": b.new_tokens[position] if position < len(b.new_tokens) else None,
                "method_token": m.new_tokens[position] if position < len(m.new_tokens) else None,
                "baseline_top2_gap": gap,
                "baseline_top_logit": top,
                "float_tie": gap is not None and float_tie(gap, top, dtype, ulps),
                "tie_rule": f"gap <= {tie_ulps(dtype, ulps)} ulps of the top logit in {str(dtype).removeprefix('torch.')}",
            },
        }
    return {"checked": True, "equal": True, "first_divergence": None}
