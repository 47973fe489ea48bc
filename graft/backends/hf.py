"""The transformers backend: an unmodified Hugging Face causal LM, hidden states captured with hooks."""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from graft.backends.compiling import compiled
from graft.backends.target import ForwardOutput, HiddenTap, TargetBackend, concat_taps
from graft.layers import ATTENTION_NAME


def decoder_of(model):
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


class HFBackend(TargetBackend):
    def __init__(self, model, tokenizer, name: str = "target"):
        super().__init__(model, tokenizer, name)
        # each tap as first hooked: equal taps of other drafters map to it, so a compiled graph's guards on the
        # taps in flight (`_wanted`, read by the hooks) hold for every drafter, not only for the one it traced
        self._hooked: dict[HiddenTap, HiddenTap] = {}
        self._wanted: frozenset[HiddenTap] = frozenset()  # the taps of the forward in flight
        self._captured: dict[HiddenTap, Tensor] = {}
        # transformers renamed past_key_values to cache; older 5.x releases silently ignore `cache=`
        self.attention = f"transformers {getattr(model.config, '_attn_implementation', None) or 'default'}"
        self._cache_keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._placed: dict | None = None  # sharded: each forward's layer inputs per device (_place_layer_inputs)

    @property
    def compact_masks(self) -> bool:
        return getattr(self.model.config, "_attn_implementation", None) == ATTENTION_NAME

    def _cache_hint(self) -> str:
        import transformers

        return f"transformers {transformers.__version__}, passed as `{self._cache_keyword}=`"

    def _hook(self, taps: tuple[HiddenTap, ...]) -> None:
        """Hooks stay registered once made; they store only what the forward in flight asked for."""
        decoder = decoder_of(self.model)
        for tap in taps:
            if tap in self._hooked:
                continue
            self.check_taps((tap,))
            if tap.where == "final":
                decoder.norm.register_forward_hook(self._post_hook(tap))
            elif tap.where == "input":
                decoder.layers[tap.layer].register_forward_pre_hook(self._pre_hook(tap), with_kwargs=True)
            else:
                decoder.layers[tap.layer].register_forward_hook(self._post_hook(tap))
            self._hooked[tap] = tap

    def _pre_hook(self, tap: HiddenTap):
        def hook(module, args, kwargs):
            if tap in self._wanted:
                self._captured[tap] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _post_hook(self, tap: HiddenTap):
        def hook(module, args, output):
            if tap in self._wanted:
                self._captured[tap] = output[0] if isinstance(output, tuple) else output

        return hook

    def _compile(self):
        return compiled(self.model, self.compile_mode, self.compile_backend)

    def _shard_hooks(self) -> None:
        """Sharded (device_map), Accelerate's hooks move a layer's mask, positions and rotary tables to its GPU at
        every layer; each is placed here once per device per forward, and the hooks find it there."""
        if self._placed is not None or len(self.devices) < 2:
            return
        self._placed = {}
        for layer in decoder_of(self.model).layers:
            layer.register_forward_pre_hook(self._place_layer_inputs, with_kwargs=True)

    def _place_layer_inputs(self, layer, args, kwargs):
        device = next(layer.parameters()).device
        skip = ("hidden_states", "past_key_values", self._cache_keyword)  # the residual stream; the cache is placed
        return args, {key: value if key in skip else self._on(value, device) for key, value in kwargs.items()}

    def _on(self, value, device):
        """`value` (a tensor, or a tuple of them: rotary's cos and sin) on `device`, copied once per forward."""
        if isinstance(value, tuple):
            return tuple(self._on(item, device) for item in value)
        if not isinstance(value, Tensor) or value.device == device:
            return value
        key = (id(value), device)
        if key not in self._placed:
            self._placed[key] = (value, value.to(device, non_blocking=True))  # the source kept: ids stay unique
        return self._placed[key][1]

    def _forward(self, ids, positions, mask, taps, logits_to_keep: int = 0, compiled: bool = False) -> ForwardOutput:
        self._hook(taps)
        self._shard_hooks()
        self._wanted = frozenset(self._hooked[tap] for tap in taps)
        model = self._compiled_module() if compiled else self.model
        try:
            out = model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **{self._cache_keyword: self.cache},
            )
            hidden = concat_taps(self._captured, taps, self.device)
        finally:
            self._wanted = frozenset()
            self._captured.clear()
            if self._placed:
                self._placed.clear()
        return ForwardOutput(logits=_owned_logits(out.logits[0], compiled), hidden=hidden)

    def _forward_rows(self, ids, positions, mask, taps, cache, compiled: bool = False) -> tuple[Tensor, Tensor | None]:
        self._hook(taps)
        self._wanted = frozenset(self._hooked[tap] for tap in taps)
        model = self._compiled_module() if compiled else self.model  # one graph per rows bucket and width
        try:
            out = model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                **{self._cache_keyword: cache},
            )
            hidden = torch.cat([self._captured[tap].to(self.device) for tap in taps], dim=-1) if taps else None
        finally:
            self._wanted = frozenset()
            self._captured.clear()
        return _owned_logits(out.logits, compiled), hidden


def _owned_logits(logits: Tensor, compiled: bool) -> Tensor:
    """The forward's logits as float32 the caller owns: a CUDA graph's outputs are overwritten by its next replay,
    so the compiled forward's are copied (.float() copies unless they are float32 already)."""
    owned = logits.float()
    return owned.clone() if compiled and logits.dtype == torch.float32 else owned
