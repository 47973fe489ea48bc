"""The lean backend: a forward over the weights of a Hugging Face Llama / Qwen2 / Qwen3 (and Qwen3-MoE) model.

On a small model on a CPU a decode step spends as long in Python and small-op dispatch as in the
weight-bound products (docs/cpu_engine.md has the profiles), so the fast paths run this gpt-fast
style forward instead of the transformers modules: fused q/k/v and gate/up products, one RMSNorm call,
the rotary tables from the model's own rotary module, and grouped-query SDPA reading the cache in
place. It uses the same weights and the same cache; tests check its logits against transformers'.
Mixture-of-experts MLPs are called as the model's own modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graft.backends.target import ForwardOutput, TargetBackend, concat_taps
from graft.cpu.native import build as native
from graft.cpu.ops import CpuOps
from graft.cpu.products import (
    Bf16PackedLinear,
    PackedLinear,
    choose_one_row_kernel,
    choose_product_kernel,
    widened_record,
)
from graft.layers import apply_rotary, fuse_linears, grouped_sdpa, rms_norm

SUPPORTED = ("llama", "qwen2", "qwen3", "qwen3_moe")
NATIVE_MODES = ("auto", "on", "off")


@dataclass
class _Layer:
    qkv: nn.Module
    o: nn.Module
    input_norm: Tensor
    post_norm: Tensor
    qk_norm: Tensor | None  # [heads + kv_heads, head_dim]: q_norm's weight per query head, k_norm's per key head
    gate_up: nn.Module | None  # dense MLP
    down: nn.Module | None
    mlp: nn.Module | None  # anything else (mixture of experts), called as is


class LeanForward:
    def __init__(self, model, make_linear: Callable[[nn.Linear], nn.Module]):
        config = model.config
        if config.model_type not in SUPPORTED:
            raise ValueError(f"the lean forward supports {', '.join(SUPPORTED)}, not '{config.model_type}'")
        decoder = model.model
        self.embed = decoder.embed_tokens
        self.rotary = decoder.rotary_emb
        self.eps = config.rms_norm_eps
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.final_norm = decoder.norm.weight.detach()
        self.lm_head = make_linear(model.lm_head)
        self.native = None  # the built native module once enable_native accepted this model
        self._native_weights: list[Tensor] = []
        self._native_prefetch: list[int] = []  # each layer's products' tile prefetch modes (native.PRODUCTS)
        self._small_rows = 0
        self.layers = []
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            dense = all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
            self.layers.append(
                _Layer(
                    qkv=make_linear(fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])),
                    o=make_linear(attn.o_proj),
                    input_norm=layer.input_layernorm.weight.detach(),
                    post_norm=layer.post_attention_layernorm.weight.detach(),
                    qk_norm=self._qk_norm(attn),
                    gate_up=make_linear(fuse_linears([mlp.gate_proj, mlp.up_proj])) if dense else None,
                    down=make_linear(mlp.down_proj) if dense else None,
                    mlp=None if dense else mlp,
                )
            )

    def _qk_norm(self, attn) -> Tensor | None:
        """Qwen3's q and k norms as one weight, so both are normalised (and then rotated) in one call."""
        if not hasattr(attn, "q_norm"):
            return None
        q, k = attn.q_norm.weight.detach(), attn.k_norm.weight.detach()
        return torch.cat([q.expand(self.heads, -1), k.expand(self.kv_heads, -1)])

    def linears(self) -> list[nn.Module]:
        """The products in the order a forward runs them."""
        per_layer = [[layer.qkv, layer.o, layer.gate_up, layer.down] for layer in self.layers]
        return [p for products in per_layer for p in products if p is not None] + [self.lm_head]

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return rms_norm(x, weight, self.eps)

    def enable_native(self, mode: str = "auto") -> dict:
        """Run every forward through the native layer loop (graft/cpu/native) where this model allows it:
        float32 on the CPU, dense MLPs, oneDNN-packed products. "auto" falls back to the Python loop (saying
        why); "on" refuses to load without it; "off" keeps the Python loop. Returns what was chosen, for run.json.
        Call it after the one-row kernel is settled: the weights handed over are the ones that survived it."""
        if mode not in NATIVE_MODES:
            raise ValueError(f"hardware.native={mode!r}; allowed: {', '.join(NATIVE_MODES)}")
        if mode == "off":
            return {"native": "off", "native_reason": "hardware.native=off"}
        reason = self._native_blocker() or native.unavailable()
        if reason is not None:
            if mode == "on":
                raise ValueError(f"hardware.native=on, but {reason}; use hardware.native=auto or off")
            return {"native": "off", "native_reason": reason}
        self.native = native.load()
        self._native_weights = [w for layer in self.layers for w in native.layer_weights(vars(layer))]
        self._native_prefetch = [mode for layer in self.layers for mode in native.layer_prefetch(vars(layer))]
        self._small_rows = max(native.small_rows(p) for p in self.linears())
        reason = f"layer loop in C++ ({self.native.variant()} build) for every forward"
        return {"native": "on", "native_reason": reason}

    def _native_blocker(self) -> str | None:
        if self.final_norm.device.type != "cpu" or self.final_norm.dtype != torch.float32:
            return f"it runs float32 on the CPU (this model: {self.final_norm.dtype} on {self.final_norm.device.type})"
        if any(layer.mlp is not None for layer in self.layers):
            return "it runs dense MLPs only (this model has mixture-of-experts layers)"
        if not all(isinstance(p, PackedLinear) for p in self.linears()):
            return "it runs oneDNN-packed products only (hardware.fast_path=packed)"
        return None

    def _native_layers(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache, taps, captured) -> Tensor:
        """The layer loop in C++: x [1, n, hidden] in, out; the cache's rows written, `captured` filled."""
        n = x.shape[1]
        start = cache.layers[0].length
        for buffer in cache.layers:
            if not buffer.is_initialized:
                shape = (1, self.kv_heads, 0, self.head_dim)
                buffer.lazy_initialization(x.new_empty(shape), x.new_empty(shape))
            buffer.reserve(start + n)
        flags = self._tap_flags(taps)
        outputs = self.native.lean_layers(
            x[0],
            self._native_weights,
            len(native.LAYER_FIELDS),
            [buffer.keys for buffer in cache.layers],
            [buffer.values for buffer in cache.layers],
            cos[0].contiguous(),
            sin[0].contiguous(),
            torch.empty(0) if mask is None else mask,
            start,
            *self._native_args(flags),
        )
        for buffer in cache.layers:
            buffer.length = start + n
        self._captured_taps(flags, outputs[1:], captured)
        return outputs[0].unsqueeze(0)

    @torch.inference_mode()
    def __call__(self, input_ids, position_ids, mask, cache, taps, logits_to_keep: int = 0):
        """input_ids/position_ids [1, n]; mask [1, 1, n, S] or None (causal); returns logits, taps dict."""
        x = self.embed(input_ids)  # [1, n, hidden]
        n = x.shape[1]
        cos, sin = self.rotary(x, position_ids)  # [1, n, head_dim]
        captured = {}
        groups = self.heads // self.kv_heads
        if mask is not None and n == 1:
            mask = None  # a one-node tree sees the whole cache: no mask needed
        elif mask is not None and groups > 1:
            mask = mask.repeat(1, 1, groups, 1)  # tiled once for grouped_sdpa's folded query axis
        if self.native is not None and not cache.static:
            x = self._native_layers(x, cos, sin, mask, cache, taps, captured)
        else:
            x = self._python_layers(x, cos.unsqueeze(1), sin.unsqueeze(1), mask, cache, taps, captured)
        if any(where == "final" for _, where in taps):
            normed = self._norm(x, self.final_norm)
            captured.update({key: normed for key in taps if key[1] == "final"})
            logits = self.lm_head(normed[:, -logits_to_keep:] if logits_to_keep else normed)
        else:
            logits = self.lm_head(self._norm(x[:, -logits_to_keep:] if logits_to_keep else x, self.final_norm))
        return logits, captured

    @torch.inference_mode()
    def rows(self, segments: list, slots, taps) -> tuple[list[Tensor], dict]:
        """Several sequences' segments (graft/backends/target.py: Segment) in one forward over the cache slots of
        `slots` (graft/backends/slots.py): the products once over every row, each segment's attention over its own
        slot. Returns each segment's logits [its logits_rows (0: all), vocab] and the taps {key: [total, hidden]}."""
        ids = torch.cat([s.ids for s in segments]).unsqueeze(0)  # [1, total]
        x = self.embed(ids)
        cos, sin = self.rotary(x, torch.cat([s.positions for s in segments]).unsqueeze(0))  # [1, total, head_dim]
        masks = [None if s.mask is None or s.length == 1 else s.mask for s in segments]  # one node sees the prefix
        captured = {}
        if self.native is not None:
            x = self._native_rows(x, cos, sin, masks, segments, slots, taps, captured)
        else:
            x = self._python_rows(x, cos.unsqueeze(1), sin.unsqueeze(1), masks, segments, slots, taps, captured)
        for segment in segments:
            for buffer in slots.slot[segment.slot].layers:
                buffer.length = segment.start + segment.length
        normed = self._norm(x, self.final_norm) if any(where == "final" for _, where in taps) else None
        captured.update({key: normed for key in taps if key[1] == "final"})
        rows, first = [], 0  # the rows whose logits are asked for: no LM head over a prompt chunk's inner rows
        for segment in segments:
            keep = segment.logits_rows or segment.length
            rows.append((first + segment.length - keep, keep))
            first += segment.length
        every = all(keep == s.length for (_, keep), s in zip(rows, segments))
        picked = x[0] if every else torch.cat([x[0, lo : lo + keep] for lo, keep in rows])
        logits = self.lm_head(normed[0] if every and normed is not None else self._norm(picked, self.final_norm))
        return list(logits.split([keep for _, keep in rows])), captured

    def _native_rows(self, x, cos, sin, masks, segments, slots, taps, captured) -> Tensor:
        """The rows' layer loop in C++ (lean_rows): x [1, total, hidden] in, out; `captured` filled."""
        flags = self._tap_flags(taps)
        outputs = self.native.lean_rows(
            x[0],
            self._native_weights,
            len(native.LAYER_FIELDS),
            slots.keys,
            slots.values,
            cos[0].contiguous(),
            sin[0].contiguous(),
            [torch.empty(0) if mask is None else mask for mask in masks],
            [s.slot for s in segments],
            [s.start for s in segments],
            [s.length for s in segments],
            *self._native_args(flags),
        )
        self._captured_taps(flags, outputs[1:], captured)
        return outputs[0].unsqueeze(0)

    def _python_rows(self, x, cos, sin, masks, segments, slots, taps, captured) -> Tensor:
        """The rows' layer loop in Python: x [1, total, hidden]; cos, sin [1, 1, total, head_dim]; each segment's
        keys written into its slot and its attention over that slot alone."""
        bounds, first = [], 0
        for segment in segments:
            bounds.append((first, first + segment.length))
            first += segment.length

        def attend(index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            keys, values, merged = slots.keys[index], slots.values[index], []
            for segment, mask, (lo, hi) in zip(segments, masks, bounds):
                slot, start, end = segment.slot, segment.start, segment.start + segment.length
                if mask is not None:  # [n, >= end] or [1, 1, n, end]: the columns this segment reads
                    mask = mask.reshape(1, 1, *mask.shape[-2:])[..., :end]
                keys[slot, :, start:end], values[slot, :, start:end] = k[0, :, lo:hi], v[0, :, lo:hi]
                seen_keys, seen_values = keys[slot : slot + 1, :, :end], values[slot : slot + 1, :, :end]
                out, _ = grouped_sdpa(
                    None, q[:, :, lo:hi], seen_keys.to(q.dtype), seen_values.to(q.dtype), mask, scaling=self.scaling
                )  # a bfloat16 cache (hardware.cache_dtype) read widened, as the native kernels read it
                merged.append(out)
            return torch.cat(merged, dim=1)

        return self._python_loop(x, cos, sin, taps, captured, attend)

    def _native_args(self, flags: list[int]) -> tuple:
        """The native layer loops' last arguments: the model's shape, the product settings, the tap flags."""
        shape = (self.heads, self.kv_heads, self.head_dim, self.eps, self.scaling, self._small_rows)
        return (*shape, flags, self._native_prefetch)

    def _tap_flags(self, taps) -> list[int]:
        """Per layer: 1 capture its input, 2 its output (the native loops' tap_flags)."""
        flags = [0] * len(self.layers)
        for index, where in taps:
            flags[index] |= {"input": 1, "output": 2}.get(where, 0)
        return flags

    def _captured_taps(self, flags: list[int], pieces, captured: dict) -> None:
        """The native loops' captured tensors [n, hidden], in layer order, into `captured` as [1, n, hidden]."""
        pieces = iter(pieces)
        for index, flag in enumerate(flags):
            for bit, where in ((1, "input"), (2, "output")):
                if flag & bit:
                    captured[(index, where)] = next(pieces).unsqueeze(0)

    def _python_layers(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache, taps, captured) -> Tensor:
        """The layer loop in Python: x [1, n, hidden] in, out; cos, sin [1, 1, n, head_dim]."""

        def attend(index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k, v = cache.update(k, v, index)  # a bfloat16 cache (hardware.cache_dtype) read widened
            return grouped_sdpa(None, q, k.to(q.dtype), v.to(q.dtype), mask, scaling=self.scaling, mask_tiled=True)[0]

        return self._python_loop(x, cos, sin, taps, captured, attend)

    def _python_loop(self, x: Tensor, cos: Tensor, sin: Tensor, taps, captured, attend) -> Tensor:
        """The decoder layers in Python over x [1, n, hidden]; attend(layer index, q, k, v) writes the keys and
        values where they belong and returns the attention [1, n, heads, head_dim]."""
        n = x.shape[1]
        q_size = self.heads * self.head_dim
        for index, layer in enumerate(self.layers):
            if (index, "input") in taps:
                captured[(index, "input")] = x
            h = self._norm(x, layer.input_norm)
            # queries and keys are normed and rotated together: per-op dispatch is much of a small step
            qkv = layer.qkv(h).view(1, n, self.heads + 2 * self.kv_heads, self.head_dim)
            qk = qkv[:, :, : self.heads + self.kv_heads]
            if layer.qk_norm is not None:
                qk = self._norm(qk, layer.qk_norm)
            qk = apply_rotary(qk.transpose(1, 2), cos, sin)  # [1, heads + kv_heads, n, head_dim]
            q, k = qk.split([self.heads, self.kv_heads], dim=1)
            v = qkv[:, :, self.heads + self.kv_heads :].transpose(1, 2)  # [1, kv_heads, n, head_dim]
            out = attend(index, q, k, v)
            x = x + layer.o(out.reshape(1, n, q_size))
            h = self._norm(x, layer.post_norm)
            if layer.mlp is None:
                gate, up = layer.gate_up(h).chunk(2, dim=-1)
                x = x + layer.down(F.silu(gate) * up)
            else:
                x = x + layer.mlp(h)
            if (index, "output") in taps:
                captured[(index, "output")] = x
        return x


def _panel_module(native_mode: str, product_kernel: str) -> tuple:
    """(graft/cpu/native's built module, None) where the panel kernel may run (hardware.native not off, an
    AVX-512F or AVX2 + FMA build), else (None, why not); hardware.product_kernel=panel refuses to load without it."""
    reason = None
    if product_kernel == "onednn":
        return None, "hardware.product_kernel=onednn"
    if native_mode == "off":
        reason = "hardware.native=off (the panel kernel is part of graft/cpu/native)"
    else:
        reason = native.unavailable() or (
            None if native.load().panels_supported() else "this CPU has neither AVX-512F nor AVX2 with FMA"
        )
    if reason is not None and product_kernel == "panel":
        raise ValueError(f"hardware.product_kernel=panel, but {reason}; use hardware.product_kernel=auto or onednn")
    return (None, reason) if reason else (native.load(), None)


class LeanBackend(TargetBackend):
    """The target through LeanForward: same weights, same cache, taps recorded by the forward itself."""

    def __init__(
        self,
        model,
        tokenizer,
        make_linear: Callable[[nn.Linear], nn.Module],
        name: str = "target",
        one_row_kernel: str = "auto",
        native_mode: str = "auto",
        product_kernel: str = "auto",
    ):
        super().__init__(model, tokenizer, name)
        self._panel_module, no_panels = None, None
        if make_linear in (PackedLinear, Bf16PackedLinear):
            self._panel_module, no_panels = _panel_module(native_mode, product_kernel)
            make_linear = partial(make_linear, native_module=self._panel_module)
        self.lean = LeanForward(model, make_linear)
        self._make_linear = make_linear
        packed = [p for p in self.lean.linears() if isinstance(p, PackedLinear)]
        if packed:
            self.kernels = choose_one_row_kernel(packed, one_row_kernel)
            self.kernels.update(choose_product_kernel(packed, product_kernel, no_panels, one_row_kernel=one_row_kernel))
            self.kernels.update(widened_record(packed))
        self.kernels = {**(self.kernels or {}), **self.lean.enable_native(native_mode)}
        self.ops = CpuOps(native.loaded(), self.product, self.lean.native, wide_target=self.dtype == torch.float32)

    @property
    def native(self):
        """The native module the layer loop runs through, or None (the Python loop)."""
        return self.lean.native

    def lm_head(self, hidden: Tensor) -> Tensor:
        """The target's LM head through the forward's own packed product (for drafters that share it)."""
        return self.lean.lm_head(hidden.to(self.device))

    def product(self, linear: nn.Linear) -> nn.Module:
        """`linear` as the target's own products run (same kernels, same one-row choice): for draft heads."""
        kernels = self.kernels or {}
        if self._panel_module is not None or kernels.get("one_row"):  # settled at load: no copy for the loser
            return PackedLinear(
                linear, one_row=kernels.get("one_row"), products=kernels, native_module=self._panel_module
            )
        return self._make_linear(linear)

    ragged_rows = True  # a batch's trees and prompt chunks run as segments of one forward (LeanForward.rows)

    def forward_segments(self, slots, segments, taps=()) -> list[ForwardOutput]:
        wanted = {(tap.layer, tap.where) for tap in taps}
        logits, captured = self.lean.rows(segments, slots, wanted)
        hidden = concat_taps({tap: captured[(tap.layer, tap.where)] for tap in taps}, taps, self.device)
        outputs, first = [], 0
        for segment, rows in zip(segments, logits):
            part = None if hidden is None else hidden[first : first + segment.length]
            outputs.append(ForwardOutput(logits=rows.float(), hidden=part))
            first += segment.length
        return outputs

    def _forward(self, ids, positions, mask, taps, logits_to_keep: int = 0, compiled: bool = False) -> ForwardOutput:
        wanted = {(tap.layer, tap.where) for tap in taps}
        logits, captured = self.lean(ids, positions, mask, self.cache, wanted, logits_to_keep)
        hidden = concat_taps({tap: captured[(tap.layer, tap.where)] for tap in taps}, taps, self.device)
        return ForwardOutput(logits=logits[0].float(), hidden=hidden)
