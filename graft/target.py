"""The target model adapter: prefill, tree verification, cache compaction and hidden-state capture.

It wraps an unmodified Hugging Face causal LM. The key/value cache is preallocated and indexed by
position (as in gpt-fast): verifying a tree writes its nodes after the committed prefix, and committing
the accepted path moves those rows down to close the gaps, so no step reallocates the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from graft.tree import DraftTree, TreeAttention


class PositionalKVLayer(CacheLayerMixin):
    """One layer's keys and values in a buffer [batch, heads, capacity, head_dim] with a fill length."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self.keys = torch.empty(b, h, self.capacity, d, dtype=key_states.dtype, device=self.device)
        self.values = torch.empty(b, h, self.capacity, value_states.shape[-1], dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        new_capacity = max(needed, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], new_capacity, old.shape[-1])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = new_capacity

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def keep(self, committed: int, rows: Tensor | None, count: int) -> None:
        """Keep `committed` rows, then `count` rows taken from `committed + rows` (None: already in place)."""
        if rows is not None:
            src = rows + committed
            self.keys[:, :, committed : committed + count] = self.keys[:, :, src]
            self.values[:, :, committed : committed + count] = self.values[:, :, src]
        self.length = committed + count

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(0, self.length + tokens_to_remove if tokens_to_remove < 0 else tokens_to_remove)


class PositionalKVCache(Cache):
    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[PositionalKVLayer(capacity) for _ in range(num_layers)])

    def keep(self, committed: int, rows: Tensor | None, count: int) -> None:
        for layer in self.layers:
            layer.keep(committed, rows, count)


@dataclass(frozen=True)
class HiddenTap:
    """A hidden state a drafter asks for: the input or the output of decoder layer `layer`, or the
    final normalised hidden state ("final", the LM head's input; `layer` is ignored)."""

    layer: int
    where: Literal["input", "output", "final"] = "input"


@dataclass
class ForwardOutput:
    logits: Tensor  # [num_positions, vocab] float32
    hidden: Tensor | None  # [num_positions, num_taps * hidden_size], taps concatenated in request order


def _decoder_layers(model) -> torch.nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return decoder.layers


class TargetModel:
    """A causal LM seen as: prefill(prompt), verify(tree), commit(path)."""

    def __init__(self, model, tokenizer, name: str = "target", lean=None):
        self.model = model.eval()
        self.lean = lean  # graft.lean.LeanForward, when a fast path is on
        self.tokenizer = tokenizer
        self.name = name
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = config
        self.num_layers: int = config.num_hidden_layers
        self.hidden_size: int = config.hidden_size
        self.vocab_size: int = config.vocab_size
        self.max_context: int = int(getattr(config, "max_position_embeddings", 4096))
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache: PositionalKVCache | None = None
        self._taps: tuple[HiddenTap, ...] = ()
        self._tap_keys: set[tuple[int, str]] = set()
        self._captured: dict[HiddenTap, Tensor] = {}
        self._hooks: list = []

    # --- hidden-state capture -------------------------------------------------------------
    def set_hidden_taps(self, taps: tuple[HiddenTap, ...]) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._taps = [], tuple(taps)
        self._tap_keys = {(tap.layer, tap.where) for tap in self._taps}
        layers = _decoder_layers(self.model)
        for tap in self._taps:
            if tap.where == "final":
                if self.lean is None:
                    decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
                    self._hooks.append(decoder.norm.register_forward_hook(self._post_hook(tap)))
                continue
            if not 0 <= tap.layer < len(layers):
                raise ValueError(f"hidden tap on layer {tap.layer}, but the target has layers 0..{len(layers) - 1}")
            if self.lean is not None:
                continue  # the lean forward records taps itself
            if tap.where == "input":
                self._hooks.append(layers[tap.layer].register_forward_pre_hook(self._pre_hook(tap), with_kwargs=True))
            else:
                self._hooks.append(layers[tap.layer].register_forward_hook(self._post_hook(tap)))

    def _pre_hook(self, tap: HiddenTap):
        def hook(module, args, kwargs):
            self._captured[tap] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _post_hook(self, tap: HiddenTap):
        def hook(module, args, output):
            self._captured[tap] = output[0] if isinstance(output, tuple) else output

        return hook

    def _collect_hidden(self) -> Tensor | None:
        if not self._taps:
            return None
        hidden = torch.cat([self._captured[tap][0] for tap in self._taps], dim=-1)
        self._captured.clear()
        return hidden

    # --- forward passes -------------------------------------------------------------------
    @property
    def cache_len(self) -> int:
        return 0 if self.cache is None else self.cache.layers[0].length

    def reset(self, capacity: int) -> None:
        """Start a new sequence with room for `capacity` positions (the cache grows if exceeded)."""
        self.cache = PositionalKVCache(self.num_layers, capacity)

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], all_logits: bool = False) -> ForwardOutput:
        """Encode the prompt into the cache; logits for the last position (every position with
        `all_logits`), hidden states for all."""
        assert self.cache is not None, "call reset() first"
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        keep = 0 if all_logits else 1
        if self.lean is not None:
            positions = torch.arange(len(prompt_ids), device=self.device).unsqueeze(0)
            return self._lean_forward(ids, positions, None, logits_to_keep=keep)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        return ForwardOutput(logits=out.logits[0].float(), hidden=self._collect_hidden())

    def _lean_forward(self, ids, positions, mask, logits_to_keep: int = 0) -> ForwardOutput:
        logits, captured = self.lean(ids, positions, mask, self.cache, self._tap_keys, logits_to_keep)
        for tap in self._taps:
            self._captured[tap] = captured[(tap.layer, tap.where)]
        return ForwardOutput(logits=logits[0].float(), hidden=self._collect_hidden())

    @torch.inference_mode()
    def verify(self, tree: DraftTree, attn: TreeAttention, mask: Tensor) -> ForwardOutput:
        """One forward over every tree node; the nodes stay in the cache until `commit`."""
        if self.lean is not None:
            return self._lean_forward(tree.tokens.unsqueeze(0), attn.position_ids(), mask)
        out = self.model(
            input_ids=tree.tokens.unsqueeze(0),
            position_ids=attn.position_ids(),
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
        )
        return ForwardOutput(logits=out.logits[0].float(), hidden=self._collect_hidden())

    @torch.inference_mode()
    def commit(self, committed_len: int, path: list[int], path_index: Tensor | None = None) -> None:
        """Keep the cache up to `committed_len` plus the verified nodes on `path` (root first).

        `path_index` is the same path already on the device, which saves a host-to-device copy."""
        in_place = path == list(range(len(path)))
        if in_place:
            rows = None
        else:
            rows = path_index if path_index is not None else torch.tensor(path, dtype=torch.long, device=self.device)
        self.cache.keep(committed_len, rows, len(path))
