"""The few layer pieces the lean target forward and the draft heads share: RMSNorm, rotary embedding,
and grouped-query attention that reads a key/value cache in place."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """As transformers' RMSNorm: normalise in fp32, cast back, then scale."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def fuse_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the parts' outputs side by side (q/k/v, gate/up): one product, not
    several, over the same weights."""
    weight = torch.cat([p.weight.detach() for p in parts], dim=0)
    biases = [p.bias for p in parts]
    fused = nn.Linear(
        weight.shape[1], weight.shape[0], bias=biases[0] is not None, dtype=weight.dtype, device=weight.device
    )
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if biases[0] is not None:
        fused.bias = nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
    return fused


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


class Rotary:
    """A rotary embedding's cos / sin table for positions 0.., built once and regrown by doubling (a draft
    step would otherwise recompute it per level). The inverse frequencies stay a plain float32 attribute,
    not a buffer: module.to(bfloat16) would round them (by up to 2^-8 relative), and the angle error grows
    with the position. `scaling` multiplies cos and sin (yarn's attention factor; 1.0 otherwise)."""

    def __init__(self, inv_freq: Tensor, scaling: float = 1.0):
        self.inv_freq, self.scaling = inv_freq.float(), scaling
        self._table: tuple[Tensor, Tensor] | None = None

    def table(self, needed: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [positions >= needed, head_dim] in x's dtype and device."""
        table = self._table
        if table is None or table[0].shape[0] < needed or table[0].dtype != x.dtype or table[0].device != x.device:
            size = max(needed, 2 * (table[0].shape[0] if table is not None else 1024))
            freqs = torch.arange(size, device=x.device).float()[:, None] * self.inv_freq.to(x.device)[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)  # [size, head_dim]
            cos, sin = emb.cos(), emb.sin()
            if self.scaling != 1.0:  # applied in float32, as transformers does
                cos, sin = cos * self.scaling, sin * self.scaling
            self._table = table = (cos.to(x.dtype), sin.to(x.dtype))
        return table

    def __call__(self, x: Tensor, positions: Tensor, limit: int | None = None) -> Tensor:
        """Rotate x [..., n, head_dim] by `positions` [n], all below `limit` (a bound known on the host:
        reading the largest position off a CUDA tensor would stall the host every draft level)."""
        cos, sin = self.table(limit or int(positions.max()) + 1, x)
        return apply_rotary(x, cos[positions], sin[positions])


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
