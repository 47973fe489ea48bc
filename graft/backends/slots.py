"""The key/value cache of a batch of sequences: one storage per layer [slots, kv_heads, capacity, head_dim].

Each slot's rows are a PositionalKVCache of their own (views into the storage), so a slot's prefill and its
commit run through the batch-1 code unchanged, at the slot's own length; `rows(slots, starts)` is the cache
one verification forward of every slot's tree writes through: slot b's new keys land after its own committed
length, and the mask (TargetBackend.verify_rows) lets each tree see only its slot's prefix and its ancestors.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from graft.backends.positional_cache import PositionalKVCache
from graft.ops import Ops


class SlotCaches:
    def __init__(self, target, slots: int, capacity: int, ops: Ops | None = None):
        """Storage for `slots` sequences of up to `capacity` positions each (prompt, answer and one tree)."""
        config = target.config
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (slots, kv_heads, capacity, head_dim)
        self.capacity = capacity
        dtype = target.cache_dtype
        self.keys = [torch.zeros(shape, dtype=dtype, device=target.device) for _ in range(target.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=target.device) for _ in range(target.num_layers)]
        self.slot: list[PositionalKVCache] = []
        for b in range(slots):
            cache = PositionalKVCache(target.num_layers, capacity, ops=ops, dtype=dtype)
            for layer, keys, values in zip(cache.layers, self.keys, self.values):
                layer.keys, layer.values = keys[b : b + 1], values[b : b + 1]  # views: writes land in the storage
                layer.growable, layer.is_initialized, layer.device = False, True, keys.device
            self.slot.append(cache)

    def rows(self, first: int, starts: Tensor) -> "RowsKVCache":
        """The cache of one forward over slots first .. first + len(starts) - 1, each writing after its `starts`
        ([rows] int64 on the storage's device: no host value a compiled graph would be specialised to)."""
        span = slice(first, first + starts.shape[0])
        return RowsKVCache([RowsKVLayer(k[span], v[span], starts) for k, v in zip(self.keys, self.values)])


class RowsKVLayer(CacheLayerMixin):
    """One layer over a span of slots: each row's new keys are written at its own start; every position of the
    storage is returned, the mask hiding what a row does not see."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, keys: Tensor, values: Tensor, starts: Tensor):
        super().__init__()
        self.keys, self.values, self.starts = keys, values, starts
        self.device, self.is_initialized = keys.device, True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        pass

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Every row's new keys and values at its own start, in one scatter each (a loop over rows was B copies)."""
        rows, heads, n, dim = key_states.shape
        at = self.starts[:, None] + torch.arange(n, device=self.starts.device)  # [rows, n]
        index = at[:, None, :, None].expand(rows, heads, n, dim)
        self.keys.scatter_(2, index, key_states.to(self.keys.dtype))
        self.values.scatter_(2, index, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return 0  # the rows' own starts live on the device; the caller passes positions and a full mask

    def get_max_length(self) -> int:
        return -1


class RowsKVCache(Cache):
    def __init__(self, layers: list[RowsKVLayer]):
        super().__init__(layers=layers)
