"""The transformers backend: an unmodified Hugging Face causal LM, hidden states captured with hooks."""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from graft.backends import ForwardOutput, HiddenTap, TargetBackend, compiled, concat_taps
from graft.nn import ATTENTION_NAME


def decoder_of(model):
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


class HFBackend(TargetBackend):
    def __init__(self, model, tokenizer, name: str = "target"):
        super().__init__(model, tokenizer, name)
        self._hooked: set[HiddenTap] = set()
        self._wanted: frozenset[HiddenTap] = frozenset()  # the taps of the forward in flight
        self._captured: dict[HiddenTap, Tensor] = {}
        # transformers renamed past_key_values to cache; older 5.x releases silently ignore `cache=`
        self.attention = f"transformers {getattr(model.config, '_attn_implementation', None) or 'default'}"
        self._cache_keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

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
            self._hooked.add(tap)

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

    def _forward(self, ids, positions, mask, taps, logits_to_keep: int = 0, compiled: bool = False) -> ForwardOutput:
        self._hook(taps)
        self._wanted = frozenset(taps)
        model = self._compiled if compiled else self.model
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
        # a CUDA graph's outputs are overwritten by its next replay: the compiled forward's logits are copied
        logits = out.logits[0].float()  # a copy unless the logits are float32 already
        if compiled and out.logits.dtype == torch.float32:
            logits = logits.clone()
        return ForwardOutput(logits=logits, hidden=hidden)
