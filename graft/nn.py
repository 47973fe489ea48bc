"""The few layer pieces the lean target forward and the draft heads share: RMSNorm, rotary embedding,
and grouped-query attention that reads a key/value cache in place."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """As transformers' RMSNorm: normalise in fp32, cast back, then scale."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half rotary embedding (Llama / Qwen layout) with cos, sin broadcastable to x."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def grouped_sdpa(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, mask_tiled=False, **kwargs
):
    """SDPA for grouped-query attention without copying keys/values per query head.

    With a tree mask, transformers' own SDPA path repeats every key/value head `groups` times (a copy of
    the whole cache per layer per step). Here the query heads that share a key/value head are folded into
    the query-length axis instead: query [b, kv_heads * groups, n, d] -> [b, kv_heads, groups * n, d],
    and the [n, S] mask is tiled `groups` times along the query axis (callers that run many layers tile
    it once and pass mask_tiled=True), so the cache is read in place. Returns ([b, n, heads, d], None),
    the signature of a transformers attention function.
    """
    b, heads, n, d = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if attention_mask is None:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            is_causal=bool(n > 1 and (is_causal is None or is_causal)),
            scale=scaling,
            enable_gqa=groups > 1,
        )
        return out.transpose(1, 2).contiguous(), None
    folded = query.reshape(b, kv_heads, groups * n, d)
    mask = attention_mask if mask_tiled or groups == 1 else attention_mask.repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, n, d).transpose(1, 2).contiguous(), None
