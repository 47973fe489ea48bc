"""A DFlash-style block drafter (arXiv 2602.06036; z-lab/dflash): a few decoder layers that predict a
whole block in one forward.

The block is [last committed token, mask x (B - 1)] at positions start .. start + B - 1. Its tokens go in
through the target's embeddings, attend to each other without a causal mask, and attend to the target's
*context features*: the outputs of a few target layers (`target_layer_ids`) at every committed position
before `start`, concatenated, projected (fc) and normed (hidden_norm), then turned into extra keys and
values by every draft layer's own k / v projections. The final norm's output at block position i goes
through the target's LM head and predicts the token at start + i. The layers are Qwen3-style (q_norm and
k_norm per head), as in the published checkpoints.

The context keys and values carry across steps on one KVBuffer per layer (only newly committed positions
are projected, as the EAGLE head's cache does); the block's own keys are scratch, dropped after the forward.
Module names follow the published checkpoints: layers.N.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm}, fc, hidden_norm, norm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from graft.draft_models.eagle.head import MLP, rotary_frequencies
from graft.kv import KVBuffer
from graft.layers import RMSNorm, Rotary, fuse_linears, grouped_sdpa


@dataclass
class BlockConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    num_layers: int
    target_layer_ids: list[int]  # target layers whose outputs are the context features
    block_size: int  # positions per block, the committed token included
    mask_token_id: int  # the token whose embedding fills the block after its first position
    vocab_size: int  # the target's (the drafter reads the target's embeddings and LM head)
    num_target_layers: int
    target_hidden_size: int | None = None  # None: hidden_size
    attention_head_dim: int | None = None  # None: hidden / heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = (
        False  # read by the shared SwiGLU MLP (graft/draft_models/eagle/head.py); published drafters have none
    )
    extra: dict = field(default_factory=dict)  # config fields kept for the round trip (dtype, eos, ...)

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def feature_size(self) -> int:
        return len(self.target_layer_ids) * (self.target_hidden_size or self.hidden_size)


def spread_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """`count` target layers spread evenly from layer 1 to layer L - 3 (one: the middle layer), the rule
    the DFlash authors use for their checkpoints."""
    if count == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    return [round(first + i * (last - first) / (count - 1)) for i in range(count)]


class BlockAttention(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        d, bias = cfg.head_dim, cfg.attention_bias
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.fast: dict[str, nn.Module] = {}  # from lean(): a dict, not submodules

    def lean(self, product) -> None:
        """Run the projections through `product` (a backend's fast products): k/v as one product."""
        self.fast = {
            "q": product(self.q_proj),
            "kv": product(fuse_linears([self.k_proj, self.v_proj])),
            "o": product(self.o_proj),
        }

    def keys_values(
        self, x: Tensor, positions: Tensor, rotary: Rotary, limit: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """x [b, n, H] -> rotated, normed keys and values [b, kv_heads, n, d] (positions below `limit`)."""
        b, n, _ = x.shape
        d, kvh = self.cfg.head_dim, self.cfg.num_kv_heads
        if self.fast:
            k, v = self.fast["kv"](x).split([kvh * d, kvh * d], dim=-1)
        else:
            k, v = self.k_proj(x), self.v_proj(x)
        k = self.k_norm(k.view(b, n, kvh, d)).transpose(1, 2)
        v = v.view(b, n, kvh, d).transpose(1, 2)
        return rotary(k, positions, limit), v

    def query(self, x: Tensor, positions: Tensor, rotary: Rotary, limit: int | None = None) -> Tensor:
        b, n, _ = x.shape
        q = self.fast["q"](x) if self.fast else self.q_proj(x)
        q = self.q_norm(q.view(b, n, self.cfg.num_heads, self.cfg.head_dim)).transpose(1, 2)
        return rotary(q, positions, limit)

    def forward(self, x: Tensor, positions: Tensor, context: KVBuffer, rotary: Rotary) -> Tensor:
        """The block x [1, B, H] (normed) at `positions` [B], over every context entry on `context` and the
        whole block (no causal mask)."""
        return self.rows(x, positions, [context], rotary, context.length + x.shape[1])

    def rows(self, x: Tensor, positions: Tensor, contexts: list[KVBuffer], rotary: Rotary, limit: int) -> Tensor:
        """Several sequences' blocks of one size, x [1, S B, H] (normed) at `positions` [S B], sequence i's rows
        after sequence i - 1's: the projections once over every row, block i's attention over contexts[i] and
        its own rows (no causal mask). `limit`: above every position (the blocks end their sequences)."""
        size = x.shape[1] // len(contexts)
        q = self.query(x, positions, rotary, limit)  # [1, heads, S B, d]
        k, v = self.keys_values(x, positions, rotary, limit)  # [1, kv_heads, S B, d]
        merged = []
        for i, context in enumerate(contexts):
            mine = slice(i * size, (i + 1) * size)
            committed = context.length
            # the block sits after the context, then is dropped
            keys, values = context.append(k[:, :, mine].contiguous(), v[:, :, mine].contiguous())
            context.length = committed
            out, _ = grouped_sdpa(None, q[:, :, mine].contiguous(), keys, values, None, is_causal=False)
            merged.append(out)  # [1, B, heads, d]
        out = merged[0] if len(merged) == 1 else torch.cat(merged, dim=1)
        return self.fast.get("o", self.o_proj)(out.reshape(1, x.shape[1], -1))


class BlockLayer(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.self_attn = BlockAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class BlockDrafter(nn.Module):
    """encode(features, caches): put newly committed context on the caches; block(embeds, caches): the
    final-normed hidden states [B, H] of the block that starts right after the context."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([BlockLayer(cfg) for _ in range(cfg.num_layers)])
        self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(*rotary_frequencies(cfg))
        self.fast: dict[str, nn.Module] = {}  # from lean()

    def lean(self, product) -> "BlockDrafter":
        """Run every product through `product` (a target backend's fast products; None where it has none).
        Inference only: the nn.Linear modules and the state dict stay as they are."""
        fc = product(self.fc)
        if fc is None:
            return self
        for layer in self.layers:
            layer.self_attn.lean(product)
            layer.mlp.lean(product)
        self.fast = {"fc": fc}
        return self

    def new_caches(self, capacity: int) -> list[KVBuffer]:
        return [KVBuffer(capacity) for _ in self.layers]

    def context(self, features: Tensor) -> Tensor:
        """Target features [..., n, len(target_layer_ids) * H] -> the context every layer reads [..., n, H]."""
        return self.hidden_norm(self.fast.get("fc", self.fc)(features.to(self.fc.weight.dtype)))

    def encode(self, features: Tensor, caches: list[KVBuffer]) -> None:
        """Append the context keys / values of the n positions committed after the cached ones (features [n, F])."""
        self.encode_rows([features], [caches])

    def encode_rows(self, features: list[Tensor], caches: list[list[KVBuffer]]) -> None:
        """encode() for several sequences (features[i] [n_i, F] after caches[i]'s positions): the context
        projection and every layer's keys and values once over all their rows, each sequence's appended to its
        own caches."""
        counts, starts = [f.shape[0] for f in features], [mine[0].length for mine in caches]
        device = features[0].device
        positions = torch.cat([torch.arange(s, s + n, device=device) for s, n in zip(starts, counts)])
        joined = features[0] if len(features) == 1 else torch.cat(features)
        ctx = self.context(joined).unsqueeze(0)  # [1, total, H]
        limit = max(s + n for s, n in zip(starts, counts))
        for index, layer in enumerate(self.layers):
            k, v = layer.self_attn.keys_values(ctx, positions, self.rotary, limit)  # [1, kv_heads, total, d]
            for mine, k_part, v_part in zip(caches, k.split(counts, dim=2), v.split(counts, dim=2)):
                mine[index].append(k_part, v_part)

    def block(self, embeds: Tensor, caches: list[KVBuffer]) -> Tensor:
        """embeds [B, H] of [committed token, mask, ...], right after the cached context -> normed hidden [B, H]."""
        return self.block_rows(embeds, [caches])

    def block_rows(self, embeds: Tensor, caches: list[list[KVBuffer]]) -> Tensor:
        """block() for several sequences' blocks of one size B: embeds [S B, H], sequence i's block after
        sequence i - 1's, each right after caches[i]'s context; every product once over all rows. Returns the
        normed hidden [S B, H]."""
        x = embeds.unsqueeze(0).to(self.fc.weight.dtype)
        size = x.shape[1] // len(caches)
        starts = [mine[0].length for mine in caches]
        positions = torch.cat([torch.arange(s, s + size, device=x.device) for s in starts])
        limit = max(starts) + size
        for index, layer in enumerate(self.layers):
            contexts = [mine[index] for mine in caches]
            x = x + layer.self_attn.rows(layer.input_layernorm(x), positions, contexts, self.rotary, limit)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)[0]
