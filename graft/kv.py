"""One key/value buffer indexed by position (as in gpt-fast), used by the target's cache layers and by
the draft heads: preallocated, grown by doubling when a sequence outruns it, compacted in place.

A static buffer (hardware.compile) has one shape for the whole sequence, so that a compiled forward (and
a CUDA graph) can be reused step after step: appends write at a position kept on the device
(`write_at`), the attention reads every slot of the buffer and the mask hides the unfilled ones, and
the host-side `length` is advanced by the owner after the forward (`advance`), outside any graph.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVBuffer:
    """Keys and values [batch, kv_heads, capacity, head_dim] and how many positions are filled.
    Allocated on the first append, when the shapes are known."""

    def __init__(self, capacity: int, static: bool = False, dtype: torch.dtype | None = None):
        self.capacity = capacity
        self.dtype = dtype  # the stored keys' and values' dtype; None: the first append's
        self.length = 0
        self.static = static
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.write_at: Tensor | None = None  # static: [1] int64, the next write position, on the device
        self._offsets: Tensor | None = None  # static: [capacity] int64, 0..capacity-1
        self.growable = True  # False: a view into a batch's storage (graft/backends/slots.py), which cannot move

    def _allocate(self, k: Tensor, v: Tensor) -> None:
        b, h, _, d = k.shape
        # a static buffer's unfilled slots are read (then masked): zeros, never stale NaN bit patterns
        new = torch.zeros if self.static else torch.empty
        self.keys = new(b, h, self.capacity, d, dtype=self.dtype or k.dtype, device=k.device)
        self.values = new(b, h, self.capacity, v.shape[-1], dtype=self.dtype or v.dtype, device=v.device)
        if self.static:
            self._offsets = torch.arange(self.capacity, device=k.device)
            if self.write_at is None:
                self.write_at = torch.full((1,), self.length, dtype=torch.long, device=k.device)
            _mark_static(self.keys, self.values, self.write_at, self._offsets)

    def _grow(self, needed: int) -> None:
        if not self.growable:
            raise RuntimeError(f"this cache is a batch slot of {self.capacity} positions; {needed} were asked for")
        self.capacity = max(needed, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = (torch.zeros if self.static else torch.empty)(
                *old.shape[:2], self.capacity, old.shape[-1], dtype=old.dtype, device=old.device
            )
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        if self.static:
            self._offsets = torch.arange(self.capacity, device=self.keys.device)
            _mark_static(self.keys, self.values, self._offsets)

    @torch.inference_mode()
    def reserve(self, needed: int) -> None:
        """Make room for `needed` positions before a forward (a static buffer cannot grow inside one)."""
        if self.keys is not None and needed > self.capacity:
            self._grow(needed)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write [b, h, n, d] keys/values after the filled positions; returns every filled position (a static
        buffer: every slot, and `length` moves only with `advance`)."""
        if self.keys is None:
            self._allocate(k, v)
        if self.static:
            where = self.write_at + self._offsets[: k.shape[-2]]  # [n]
            self.keys.index_copy_(2, where, k)
            self.values.index_copy_(2, where, v)
            self.write_at.add_(k.shape[-2])
            return self.keys, self.values
        start, end = self.length, self.length + k.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def advance(self, count: int) -> None:
        """A static buffer's host-side length after a forward wrote `count` positions."""
        if self.static:
            self.length += count

    def keep(self, committed: int, rows: Tensor | None, count: int) -> None:
        """Keep `committed` positions, then `count` positions taken from `committed + rows` (None: already in place)."""
        if rows is not None:
            src = rows.to(self.keys.device, non_blocking=True) + committed  # this layer may sit on another GPU
            self.keys[:, :, committed : committed + count] = self.keys[:, :, src]
            self.values[:, :, committed : committed + count] = self.values[:, :, src]
        self.length = committed + count
        if self.write_at is not None:
            with torch.inference_mode():  # made by a forward in inference mode; callers outside one may roll back
                self.write_at.fill_(self.length)


def _mark_static(*tensors: Tensor) -> None:
    """Tell torch.compile these buffers keep their address, so CUDA graphs read them in place."""
    if hasattr(torch, "_dynamo"):
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)
