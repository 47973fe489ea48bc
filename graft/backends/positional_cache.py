"""The target's key/value cache: a KVBuffer per layer, indexed by position (as in gpt-fast), seen through
transformers' Cache interface so that its forward writes into it; committing a path moves the accepted rows down
in place (an engine's ops may move every layer's rows in one call)."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from graft.kv import KVBuffer
from graft.ops import Ops


class PositionalKVLayer(KVBuffer, CacheLayerMixin):
    """One layer's KVBuffer seen through transformers' cache-layer interface."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, capacity: int, static: bool = False, dtype: torch.dtype | None = None):
        CacheLayerMixin.__init__(self)
        KVBuffer.__init__(self, capacity, static, dtype)

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self._allocate(key_states, value_states)
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self.append(key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.capacity if self.static else self.length + query_length), 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.keep(0, None, 0)

    def crop(self, max_length: int) -> None:
        """transformers' contract: keep the first `max_length` positions; a negative value drops that many."""
        self.keep(max(0, self.length + max_length if max_length < 0 else min(max_length, self.length)), None, 0)


class PositionalKVCache(Cache):
    def __init__(self, num_layers: int, capacity: int, *, static: bool = False, ops: Ops | None = None, dtype=None):
        super().__init__(layers=[PositionalKVLayer(capacity, static, dtype) for _ in range(num_layers)])
        self.static = static
        self.ops = ops or Ops()

    def keep(self, committed: int, rows: Tensor | None, count: int) -> None:
        first = self.layers[0]
        if rows is not None and not self.static and first.keys is not None:
            tensors = [t for layer in self.layers for t in (layer.keys, layer.values)]
            if self.ops.move_rows(tensors, committed, rows):
                rows = None  # in place now: the layers only set their lengths
        placed = {}  # the rows once per device: a sharded cache's layers sit on several GPUs
        for layer in self.layers:
            layer.keep(committed, rows_on(layer, rows, placed), count)

    def reserve(self, needed: int) -> None:
        for layer in self.layers:
            layer.reserve(needed)

    def advance(self, count: int) -> None:
        for layer in self.layers:
            layer.advance(count)

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity


def rows_on(layer: KVBuffer, rows: Tensor | None, placed: dict) -> Tensor | None:
    """`rows` on `layer`'s device, copied there once per commit however many layers that device holds."""
    if rows is None or layer.keys is None:
        return rows
    device = layer.keys.device
    if device not in placed:
        placed[device] = rows.to(device, non_blocking=True)
    return placed[device]
