"""EAGLE draft heads: EAGLE-3 (fused multi-layer features, own reduced-vocabulary LM head) and
EAGLE-1/2 (last-layer features, the target's LM head). Both are one decoder layer that runs on a
small KV cache of its own (a `graft.kv.KVBuffer`), so only newly accepted tokens are re-encoded each step.

Module and parameter names follow the published checkpoints, so their state dicts load as they are:
EAGLE-3: fc, midlayer.{self_attn,mlp,hidden_norm,input_layernorm,post_attention_layernorm}, norm,
lm_head, d2t, t2d (and embed_tokens when the head is narrower than its target, so it cannot share the
target's table). EAGLE-1: fc (with bias), layers.0.{self_attn,mlp,post_attention_layernorm}.
How each field of the published configs is honoured: docs/published_heads.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graft.kv import KVBuffer
from graft.layers import RMSNorm, Rotary, fuse_linears, grouped_sdpa
from graft.ops import DraftLayer
from graft.tree import prefix_causal


@dataclass
class HeadConfig:
    kind: str  # "eagle3" | "eagle1"
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # eagle3: the head's own output vocabulary
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    fc_bias: bool = False  # eagle1 checkpoints have a bias on fc
    layer_ids: list[int] = field(default_factory=list)  # eagle3: target layers whose inputs are fused
    # per-head width; None means hidden / heads. Qwen3 heads set it apart (235B: hidden 4096, 64 heads, 128)
    attention_head_dim: int | None = None
    # the config's rope_scaling without rope_theta, rope_type always named ("llama3", "linear", "yarn");
    # None: plain rotary embedding. The frequencies come from transformers' own functions (rotary_frequencies)
    rope_scaling: dict | None = None
    max_position_embeddings: int | None = None  # read only by yarn without a factor (see rotary_frequencies)
    attention_bias: bool = False  # q, k, v and o projections with bias, as transformers' LlamaAttention
    qkv_bias: bool = False  # q, k and v only (EAGLE-1 heads for Qwen2 targets, as EAGLE's cnets1.py reads it)
    mlp_bias: bool = False  # gate, up and down projections with bias, as transformers' LlamaMLP

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def own_embeddings(self) -> bool:
        """An EAGLE-3 head narrower (or wider) than its target cannot read the target's token embeddings;
        it carries its own table (embed_tokens), which EAGLE's loader then takes from the checkpoint
        (EAGLE3-LLaMA3.3-Instruct-70B is narrower than Llama-3.3-70B)."""
        return self.kind == "eagle3" and self.hidden_size != self.target_hidden_size


def rotary_frequencies(cfg: HeadConfig) -> tuple[Tensor, float]:
    """(inverse frequencies [head_dim / 2], attention scaling) of the head's rotary embedding.

    Without scaling this is the plain formula (what transformers computes for rope_type "default"); with
    scaling the frequencies come from transformers' own init function for the rope type, called on a
    LlamaConfig holding the head's fields, so llama3 / linear / yarn heads rotate exactly as transformers'
    Llama layer with that config. The scaling multiplies cos and sin (1.0 except for yarn)."""
    d = cfg.head_dim
    if cfg.rope_scaling is None:
        return 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2).float() / d)), 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {**cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    max_positions = cfg.max_position_embeddings or 2048  # LlamaConfig's default
    original = rope.get("original_max_position_embeddings")
    if original and rope.get("factor") is not None:
        # transformers warns when the original length exceeds max_position_embeddings, which only yarn
        # without a factor reads (factor = max / original): with a factor, raising it changes nothing
        max_positions = max(max_positions, int(original))
    config = LlamaConfig(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=d,
        max_position_embeddings=max_positions,
        rope_parameters=rope,
    )
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    return inv_freq.float(), float(scaling)


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig, in_features: int):
        super().__init__()
        self.cfg = cfg
        d, qkv_bias = cfg.head_dim, cfg.attention_bias or cfg.qkv_bias
        self.q_proj = nn.Linear(in_features, cfg.num_heads * d, bias=qkv_bias)
        self.k_proj = nn.Linear(in_features, cfg.num_kv_heads * d, bias=qkv_bias)
        self.v_proj = nn.Linear(in_features, cfg.num_kv_heads * d, bias=qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.rotary = Rotary(*rotary_frequencies(cfg))
        self.fast: dict[str, nn.Module] = {}  # from lean(): a dict, not submodules, not in the state dict

    def lean(self, product) -> None:
        """Run the projections through `product` (a backend's fast products): q/k/v as one product."""
        self.fast = {"qkv": product(fuse_linears([self.q_proj, self.k_proj, self.v_proj])), "o": product(self.o_proj)}

    def _rope(self, x: Tensor, positions: Tensor, limit: int | None = None) -> Tensor:
        return self.rotary(x, positions, limit)

    def _rotary_table(self, needed: int, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.rotary.table(needed, x)

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor | None, cache: KVBuffer | None) -> Tensor:
        n, d = x.shape[1], self.cfg.head_dim
        if self.fast:
            q_size, kv_size = self.cfg.num_heads * d, self.cfg.num_kv_heads * d
            q, k, v = self.fast["qkv"](x).split([q_size, kv_size, kv_size], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(1, n, self.cfg.num_heads, d).transpose(1, 2)
        k = k.view(1, n, self.cfg.num_kv_heads, d).transpose(1, 2)
        v = v.view(1, n, self.cfg.num_kv_heads, d).transpose(1, 2)
        # drafted positions never pass the cache's end; a static cache's end is fixed, so its table is too
        limit = cache.capacity if cache is not None and cache.static else (cache.length if cache is not None else 0) + n
        q, k = self._rope(q, positions, limit), self._rope(k, positions, limit)
        if cache is not None:
            k, v = cache.append(k, v)
        if mask is None and n > 1:  # causal over the new positions, all of the cached prefix visible
            mask = prefix_causal(n, k.shape[2] - n, x.device)[None, None]
        # grouped_sdpa folds the query heads that share a key/value head instead of passing enable_gqa with a
        # mask, which CUDA serves only with the math kernel (an [heads, n, S] float32 score matrix)
        out, _ = grouped_sdpa(None, q, k, v, mask)  # [1, n, heads, d]
        return self.fast.get("o", self.o_proj)(out.reshape(1, n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.fast: dict[str, nn.Module] = {}  # from lean(): a dict, not submodules

    def lean(self, product) -> None:
        self.fast = {"gate_up": product(fuse_linears([self.gate_proj, self.up_proj])), "down": product(self.down_proj)}

    def forward(self, x: Tensor) -> Tensor:
        if self.fast:
            gate, up = self.fast["gate_up"](x).chunk(2, dim=-1)
            return self.fast["down"](F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """The decoder layer whose attention reads [norm(embedding); norm(hidden)] (2H wide)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.self_attn = Attention(cfg, 2 * cfg.hidden_size)
        self.mlp = MLP(cfg)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds, hidden, positions, mask, cache):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = hidden + self.self_attn(x, positions, mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle1Layer(nn.Module):
    """A Llama decoder layer without the input norm (the first layer of an EAGLE-1 head)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.self_attn = Attention(cfg, cfg.hidden_size)
        self.mlp = MLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden, positions, mask, cache):
        hidden = hidden + self.self_attn(hidden, positions, mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DraftHead(nn.Module):
    """step(): encode (token embedding, feature) pairs at `positions`; logits(): next-token scores."""

    def __init__(self, cfg: HeadConfig, target_lm_head=None):
        super().__init__()
        self.cfg = cfg
        self.fast: dict[str, nn.Module] = {}  # from lean()
        self.engine: DraftLayer | None = None  # from lean(): the backend's run of the layer, where it has one
        self.compiled_step = None  # from compile()
        if cfg.kind == "eagle3":
            self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
            self.midlayer = Eagle3Layer(cfg)
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
            if cfg.own_embeddings:
                self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        elif cfg.kind == "eagle1":
            self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
            self.layers = nn.ModuleList([Eagle1Layer(cfg)])
            self._target_lm_head = [target_lm_head]  # a list: not a submodule, not in the state dict
        else:
            raise ValueError(f"head kind {cfg.kind!r}; allowed: eagle3, eagle1")

    def lean(self, ops) -> "DraftHead":
        """Run every product of the head through `ops.product` (a target backend's fast products, with its
        kernels; None where the backend has none): q/k/v and gate/up fused, fc and the LM head packed; and the
        layer through the backend's engine where it has one (`ops.draft_layer`). Inference only: the nn.Linear
        modules (and the state dict) stay as they are, and training reads them."""
        fc = ops.product(self.fc)
        if fc is None:  # a backend without fast products
            return self
        layer = self._layer()
        layer.self_attn.lean(ops.product)
        layer.mlp.lean(ops.product)
        self.fast = {"fc": fc}  # a dict: not submodules, not in the state dict
        if self.cfg.kind == "eagle3":
            self.fast["lm_head"] = ops.product(self.lm_head)
        self.engine = ops.draft_layer(self)
        return self

    def _layer(self):
        return self.midlayer if self.cfg.kind == "eagle3" else self.layers[0]

    def embedder(self, target_embed):
        """The token embedding the head reads: its own table when it has one, else the target's."""
        return self.embed_tokens if self.cfg.own_embeddings else target_embed

    def new_cache(self, capacity: int, static: bool = False) -> KVBuffer:
        return KVBuffer(capacity, static)

    def compile(self, mode: str | None, backend: str = "inductor") -> None:
        """A compiled `step` for drafting levels (hardware.compile): one [top_k]-node shape over a static cache."""
        from graft.backends.compiling import compiled

        self.compiled_step = compiled(self.step, mode, backend)

    def step(self, embeds: Tensor, hidden: Tensor, positions: Tensor, mask: Tensor | None, cache: KVBuffer) -> Tensor:
        """embeds [n, H], hidden [n, F] (target features, or the head's own outputs: H wide) -> [n, H]."""
        if self.engine is not None and not cache.static:  # a static cache is the compiled path's
            return self.engine.step(embeds, hidden, positions, mask, cache)
        embeds, hidden = embeds.unsqueeze(0).to(self.fc.weight.dtype), hidden.unsqueeze(0).to(self.fc.weight.dtype)
        if self.cfg.kind == "eagle3":
            if hidden.shape[-1] != self.cfg.hidden_size:  # fused target features: project once
                hidden = self.fast.get("fc", self.fc)(hidden)
            return self.midlayer(embeds, hidden, positions, mask, cache)[0]
        x = self.fast.get("fc", self.fc)(torch.cat([embeds, hidden], dim=-1))
        return self.layers[0](x, positions, mask, cache)[0]

    def runs_rows(self, caches: list) -> bool:
        """Whether `rows` can run these caches' entries as one forward (the engine's layer, dynamic caches)."""
        engine = self.engine is not None and hasattr(self.engine, "rows") and self.cfg.kind == "eagle3"
        return engine and not any(c.static for c in caches)

    def rows(self, embeds: Tensor, hidden: Tensor, caches: list, positions: Tensor, masks: list, counts: list[int]):
        """Several caches' new entries as one forward over their rows (the engine's `rows`: masks[s] additive
        float32 [counts[s], >= cache length + counts[s]]), where runs_rows(caches)."""
        return self.engine.rows(embeds, hidden, caches, positions, masks, counts)

    def top_log_probs(self, out: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """(values, indices) [n, k]: each row's k most likely draft tokens by log-probability, largest first, and
        the draft-to-target id offsets (or None)."""
        if self.engine is not None:
            return self.engine.top_log_probs(out, k)
        logp, d2t = self.log_probs(out)
        top = torch.topk(logp, k, dim=-1)
        return top.values, top.indices, d2t

    def log_probs(self, out: Tensor) -> tuple[Tensor, Tensor | None]:
        """Log-probabilities over the head's vocabulary, and the draft-to-target id offsets (or None)."""
        logits, d2t = self.engine.logits(out) if self.engine is not None else self.logits(out)
        return torch.log_softmax(logits.float(), dim=-1), d2t

    def logits(self, out: Tensor) -> tuple[Tensor, Tensor | None]:
        """Scores over the head's vocabulary from its layer's output, and the draft-to-target id offsets (or None)."""
        if self.cfg.kind == "eagle3":
            same_vocab = self.cfg.draft_vocab_size == self.cfg.vocab_size
            return self.fast.get("lm_head", self.lm_head)(self.norm(out)), None if same_vocab else self.d2t
        return self._target_lm_head[0](out), None
