"""A draft head's decoder layer through graft/cpu/native (`head_layer`): the CPU engine's `ops.draft_layer`.

The layer runs every step over a growing cache in float32, whatever the head's weights (a bfloat16 head's
products read bfloat16 weights, its activations stay float32), so the cache keeps one dtype. Its log-softmax
is never written out: top-k of the logits (one native pass) minus each row's logsumexp.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graft.cpu.native import build as native
from graft.cpu.products import PackedLinear
from graft.tree import additive_mask, prefix_causal


class NativeHeadLayer:
    def __init__(self, head, module, top_k_rows):
        self.head, self.module, self.top_k_rows = head, module, top_k_rows
        cfg, layer = head.cfg, head._layer()
        products = {**layer.self_attn.fast, **layer.mlp.fast}
        eagle3 = cfg.kind == "eagle3"
        norms = {"input_norm": layer.input_layernorm.weight if eagle3 else None}
        norms["post_norm"] = layer.post_attention_layernorm.weight
        weights = native.layer_weights({**norms, **products})  # no q/k norm
        weights.append(layer.hidden_norm.weight.detach() if eagle3 else torch.empty(0))  # after LAYER_FIELDS
        self.weights = [w.float() if w.ndim == 1 else w for w in weights]
        self.final_norm = head.norm.weight.detach().float().contiguous() if eagle3 else None
        self.small_rows = max(native.small_rows(p) for p in products.values())
        self.prefetch = native.layer_prefetch(products)

    @staticmethod
    def applies(head) -> bool:
        """Float32 or bfloat16 weights, every product of the layer on the engine's packed products."""
        layer = head._layer()
        products = {**layer.self_attn.fast, **layer.mlp.fast}
        return head.fc.weight.dtype in (torch.float32, torch.bfloat16) and all(
            isinstance(p, PackedLinear) for p in products.values()
        )

    def _product(self, name: str, x: Tensor) -> Tensor:
        """fc or lm_head on float32 x: the bfloat16 panels take it as it is (they round it themselves), oneDNN's
        bfloat16 products after a cast."""
        head = self.head
        linear = head.fast.get(name, getattr(head, name))
        dtype = head.fc.weight.dtype
        if dtype == x.dtype or getattr(linear, "narrow_panels", False):
            return linear(x)
        return linear(x.to(dtype)).float()

    def step(self, embeds: Tensor, hidden: Tensor, positions: Tensor, mask: Tensor | None, cache) -> Tensor:
        embeds, hidden = embeds.float(), hidden.float()
        if self.head.cfg.kind == "eagle3":
            if hidden.shape[-1] != self.head.cfg.hidden_size:  # fused target features: project once
                hidden = self._product("fc", hidden)
            return self.layer(embeds, hidden, positions, mask, cache)
        x = self._product("fc", torch.cat([embeds, hidden], dim=-1))
        return self.layer(None, x, positions, mask, cache)

    def layer(self, embeds: Tensor | None, hidden: Tensor, positions: Tensor, mask: Tensor | None, cache) -> Tensor:
        """The decoder layer: embeds [n, H] (EAGLE-3) or None, hidden [n, H] -> [n, H], all float32."""
        cfg, attn = self.head.cfg, self.head._layer().self_attn
        n, start, d = hidden.shape[0], cache.length, cfg.head_dim
        if mask is None and n > 1:  # causal over the new entries, the whole cache visible
            mask = additive_mask(prefix_causal(n, start, hidden.device), torch.float32)
        elif mask is not None:
            mask = mask.float()  # a bfloat16 head's callers build its masks in bfloat16
        if cache.keys is None:
            shape = (1, cfg.num_kv_heads, 0, d)
            cache._allocate(hidden.new_empty(shape), hidden.new_empty(shape))
        cache.reserve(start + n)
        cos, sin = attn.rotary.table(start + n, hidden)
        out = self.module.head_layer(
            torch.empty(0) if embeds is None else embeds.contiguous(),
            hidden.contiguous(),
            self.weights,
            cache.keys,
            cache.values,
            cos[positions],
            sin[positions],
            torch.empty(0) if mask is None else mask,
            start,
            *self._layer_args(),
        )
        cache.length = start + n
        return out

    def _layer_args(self) -> tuple:
        """The layer's shape and product settings, the native calls' last arguments."""
        cfg = self.head.cfg
        d = cfg.head_dim
        return cfg.num_heads, cfg.num_kv_heads, d, cfg.rms_norm_eps, d**-0.5, self.small_rows, self.prefetch

    def rows(
        self, embeds: Tensor, hidden: Tensor, caches: list, positions: Tensor, masks: list, counts: list[int]
    ) -> Tensor | None:
        """One head_rows forward: embeds, hidden [rows, .] hold counts[s] new entries of caches[s] after the
        previous caches' (masks[s]: additive float32 [counts[s], >= cache length + counts[s]], or None: causal);
        the products once over every row, each cache's attention over itself. Returns [rows, H]; None for an
        EAGLE-1 head."""
        cfg = self.head.cfg
        if cfg.kind != "eagle3":
            return None
        hidden = hidden.float()
        if hidden.shape[-1] != cfg.hidden_size:  # fused target features: projected once for every cache
            hidden = self._product("fc", hidden)
        attn, d, empty = self.head._layer().self_attn, cfg.head_dim, torch.empty(0)
        for cache, n in zip(caches, counts):
            if cache.keys is None:
                shape = (1, cfg.num_kv_heads, 0, d)
                cache._allocate(hidden.new_empty(shape), hidden.new_empty(shape))
            cache.reserve(cache.length + n)
        table_cos, table_sin = attn.rotary.table(max(c.length + n for c, n in zip(caches, counts)), hidden)
        out = self.module.head_rows(
            embeds.float().contiguous(),
            hidden.contiguous(),
            self.weights,
            [c.keys for c in caches],
            [c.values for c in caches],
            table_cos[positions].contiguous(),
            table_sin[positions].contiguous(),
            [empty if m is None else m for m in masks],
            [c.length for c in caches],
            counts,
            *self._layer_args(),
        )
        for cache, n in zip(caches, counts):
            cache.length += n
        return out

    def logits(self, out: Tensor) -> tuple[Tensor, Tensor | None]:
        head = self.head
        if head.cfg.kind != "eagle3":
            return head._target_lm_head[0](out), None
        if out.dtype == torch.float32:  # the final norm in float32, one native pass
            normed = self.module.rms_norm_rows(out.contiguous(), self.final_norm, head.cfg.rms_norm_eps)
        else:
            normed = head.norm(out)
        same_vocab = head.cfg.draft_vocab_size == head.cfg.vocab_size
        return self._product("lm_head", normed), None if same_vocab else head.d2t

    def top_log_probs(self, out: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
        logits, d2t = self.logits(out)
        logits = logits.float().contiguous()
        values, indices = self.top_k_rows(logits, k)
        return values - self.module.row_logsumexp(logits), indices, d2t
