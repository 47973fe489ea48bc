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


# transformers' name for grouped_sdpa (hardware.attention); its masks come from graft_mask
ATTENTION_NAME = "graft_sdpa"


def graft_mask(*args, **kwargs):
    """transformers' mask function for graft_sdpa: None (no mask) where the mask would be plain causal over a
    cache whose every slot is filled, since grouped_sdpa then attends the cached prefix whole and the new
    positions causally without one (a [chunk, prefix + chunk] mask per prompt chunk otherwise); anything
    else (padding, overlays, a static cache's unfilled slots) is sdpa_mask's."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    q_offset = kwargs.get("q_offset")
    plain = (
        not args
        and kwargs.get("attention_mask") is None
        and kwargs.get("mask_function") is causal_mask_function
        and kwargs.get("allow_is_causal_skip", True)
        and kwargs.get("kv_offset", 0) == 0
        and isinstance(q_offset, int)  # a static cache layer's is a tensor
        and kwargs.get("kv_length") == q_offset + kwargs.get("q_length", -1)
    )
    return None if plain else sdpa_mask(*args, **kwargs)


def grouped_sdpa(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, mask_tiled=False, **kwargs
):
    """SDPA for grouped-query attention without copying keys/values per query head.

    With a tree mask, transformers' own SDPA path repeats every key/value head `groups` times (a copy of
    the whole cache per layer per step). Here the query heads that share a key/value head are folded into
    the query-length axis instead: query [b, kv_heads * groups, n, d] -> [b, kv_heads, groups * n, d],
    and the [n, S] mask is tiled `groups` times along the query axis (callers that run many layers tile
    it once and pass mask_tiled=True), so the cache is read in place.

    Compact masks (graft_sdpa's own; no [n, S] tensor): a mask over the last n keys only ([1, 1, n, n], a
    tree's block, or tiled [1, 1, groups * n, n]) means every query sees the S - n keys before them (the
    committed prefix) unmasked; no mask with n > 1 queries over S > n keys means causal (the prefix seen
    whole, the new block causal). Both run as two attentions merged by their log-sum-exps (split_attention).
    Returns ([b, n, heads, d], None), the signature of a transformers attention function.
    """
    b, heads, n, d = query.shape
    kv_heads, total = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    causal = n > 1 and (is_causal is None or is_causal)
    if attention_mask is None and (not causal or total == n):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None
    if attention_mask is None or attention_mask.shape[-1] < total:
        return split_attention(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None
    folded = query.reshape(b, kv_heads, groups * n, d)
    mask = attention_mask if mask_tiled or groups == 1 else attention_mask.repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, n, d).transpose(1, 2).contiguous(), None


def split_attention(query: Tensor, key: Tensor, value: Tensor, block_mask: Tensor | None, scale=None) -> Tensor:
    """Attention of query [b, heads, n, d] over key/value [b, kv_heads, S, d] whose last n keys are the
    queries' own block: the S - n before them (the committed prefix) are seen by every query, unmasked; the
    block through `block_mask`, additive [1, 1, n, n] or tiled [1, 1, groups * n, n] (a tree), or causally
    (None: a prompt chunk). The two parts run separately and are merged by their log-sum-exps, so nothing of
    size [n, S] is built and no key/value is copied per query head. Returns [b, heads, n, d]."""
    b, heads, n, d = query.shape
    kv_heads, start = key.shape[1], key.shape[2] - n
    groups = heads // kv_heads
    block_k, block_v = key[:, :, start:], value[:, :, start:]  # [b, kv_heads, n, d]
    if block_mask is None:
        # causal needs each query head on its own query axis: one call per head of a group (a view, no copy)
        per_head = query.view(b, kv_heads, groups, n, d)
        parts = [attention_lse(per_head[:, :, g], block_k, block_v, scale=scale, is_causal=True) for g in range(groups)]
        out = torch.stack([o for o, _ in parts], dim=2).view(b, kv_heads, groups * n, d)
        lse = torch.stack([s for _, s in parts], dim=2).view(b, kv_heads, groups * n)
        folded = query.reshape(b, kv_heads, groups * n, d) if start else None
    else:
        folded = query.reshape(b, kv_heads, groups * n, d)  # the heads of a group on the query axis
        if block_mask.dtype == torch.bool:
            block_mask = torch.zeros_like(block_mask, dtype=query.dtype).masked_fill_(
                ~block_mask, torch.finfo(query.dtype).min
            )
        if block_mask.shape[-2] != groups * n:
            block_mask = block_mask.repeat(1, 1, groups, 1)  # [1, 1, groups * n, n]: small, unlike [n, S]
        out, lse = attention_lse(folded, block_k, block_v, block_mask, scale)  # [b, kv_heads, groups * n, d]
    if start:
        prefix_out, prefix_lse = attention_lse(folded, key[:, :, :start], value[:, :, :start], scale=scale)
        out = merge_attention(prefix_out, prefix_lse, out, lse)
    return out.reshape(b, heads, n, d)  # a CUDA kernel's output may be a transposed view


def merge_attention(out1: Tensor, lse1: Tensor, out2: Tensor, lse2: Tensor) -> Tensor:
    """Two attentions of the same queries over disjoint keys -> the attention over both: each weighted by
    its share of the softmax mass, exp(lse1) / (exp(lse1) + exp(lse2)) = sigmoid(lse1 - lse2) (stable).
    out [..., q, d], lse [..., q] float32; computed in float32, returned in out1's dtype."""
    share = torch.sigmoid(lse1 - lse2).unsqueeze(-1)  # [..., q, 1]
    return torch.lerp(out2.float(), out1.float(), share).to(out1.dtype)


def attention_lse(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, scale=None, is_causal: bool = False
) -> tuple[Tensor, Tensor]:
    """softmax(query key^T * scale + mask) value and its log-sum-exp: query [b, h, q, d] against key/value
    [b, h, k, d] (k >= 1); mask additive, broadcastable to [b, h, q, k]; is_causal: query i sees keys <= i.
    Returns out [b, h, q, d] in query's dtype and lse [b, h, q] float32. A fused kernel where torch has one
    that returns the log-sum-exp, else the math in float32, chunked over the keys."""
    if query.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, is_causal=is_causal, attn_mask=mask, scale=scale
        )
    if query.device.type == "cuda" and mask is None:
        fused = _cuda_attention_lse(query, key, value, scale, is_causal)
        if fused is not None:
            return fused
    return math_attention_lse(query, key, value, mask, scale, is_causal)


_REFUSED: set[tuple] = set()  # (kernel, dtype, head_dim) a fused CUDA kernel refused once: not asked again


def _cuda_attention_lse(query, key, value, scale, is_causal) -> tuple[Tensor, Tensor] | None:
    """Flash attention (half precision) or memory-efficient attention, unmasked, both of which return the
    log-sum-exp; None when neither takes these inputs."""
    aten = torch.ops.aten
    kernels = {
        "flash": lambda: aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, is_causal, False, scale=scale
        ),
        "efficient": lambda: aten._scaled_dot_product_efficient_attention(
            query, key, value, None, True, 0.0, is_causal, scale=scale
        ),
    }
    for name, call in kernels.items():
        tag = (name, query.dtype, query.shape[-1])
        if tag in _REFUSED or (name == "flash" and query.dtype not in (torch.float16, torch.bfloat16)):
            continue
        try:
            out, lse = call()[:2]
        except (RuntimeError, NotImplementedError):
            _REFUSED.add(tag)
            continue
        # the efficient kernel pads its log-sum-exp's query axis to a multiple of 32
        return out, lse[..., : query.shape[-2]].float()
    return None


def math_attention_lse(query, key, value, mask=None, scale=None, is_causal=False, chunk: int = 4096):
    """attention_lse in float32 over `chunk` keys at a time (scores [b, h, q, chunk], never [q, k]),
    merged by their log-sum-exps."""
    q = query.float() * (query.shape[-1] ** -0.5 if scale is None else scale)
    out = lse = None
    for lo in range(0, key.shape[-2], chunk):
        scores = q @ key[..., lo : lo + chunk, :].float().transpose(-1, -2)  # [b, h, q, chunk]
        if mask is not None:
            scores = scores + mask[..., lo : lo + chunk].float()
        if is_causal:  # query i sees key j <= i; a finite fill keeps rows with no key in this chunk NaN-free
            rows = torch.arange(q.shape[-2], device=q.device)[:, None]
            cols = torch.arange(lo, lo + scores.shape[-1], device=q.device)[None, :]
            scores = scores.masked_fill(cols > rows, torch.finfo(torch.float32).min)
        part_lse = scores.logsumexp(-1)  # [b, h, q]
        part = torch.softmax(scores, dim=-1) @ value[..., lo : lo + chunk, :].float()
        if out is None:
            out, lse = part, part_lse
        else:
            out, lse = merge_attention(out, lse, part, part_lse), torch.logaddexp(lse, part_lse)
    return out.to(query.dtype), lse
