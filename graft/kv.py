"""One key/value buffer indexed by position (as in gpt-fast), used by the target's cache layers and by
the draft heads: preallocated, grown by doubling when a sequence outruns it, compacted in place."""

from __future__ import annotations

import torch
from torch import Tensor


class KVBuffer:
    """Keys and values [batch, kv_heads, capacity, head_dim] and how many positions are filled.
    Allocated on the first append, when the shapes are known."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.length = 0
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def _allocate(self, k: Tensor, v: Tensor) -> None:
        b, h, _, d = k.shape
        self.keys = torch.empty(b, h, self.capacity, d, dtype=k.dtype, device=k.device)
        self.values = torch.empty(b, h, self.capacity, v.shape[-1], dtype=v.dtype, device=v.device)

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], self.capacity, old.shape[-1])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write [b, h, n, d] keys/values after the filled positions; returns every filled position."""
        if self.keys is None:
            self._allocate(k, v)
        start, end = self.length, self.length + k.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def keep(self, committed: int, rows: Tensor | None, count: int) -> None:
        """Keep `committed` positions, then `count` positions taken from `committed + rows` (None: already in place)."""
        if rows is not None:
            src = rows.to(self.keys.device, non_blocking=True) + committed  # this layer may sit on another GPU
            self.keys[:, :, committed : committed + count] = self.keys[:, :, src]
            self.values[:, :, committed : committed + count] = self.values[:, :, src]
        self.length = committed + count
