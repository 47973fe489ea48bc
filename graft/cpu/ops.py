"""The CPU engine's operations (graft.ops.Ops): native top-k and row moves, the lean backend's products for
draft models, the draft head's layer in C++, and the head dtype the build multiplies fastest."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from graft.cpu.head import NativeHeadLayer
from graft.cpu.products import widened_record
from graft.ops import Ops


class CpuOps(Ops):
    """`module`: graft/cpu/native's built module for the helpers (None where it did not build); `product`: the
    backend's products for a linear (same kernels, same one-row choice as the target's); `layer_module`: the
    module where the target runs its layer loop there, so draft heads may too (None: hardware.native off, or a
    target it does not take); `wide_target`: a float32 target."""

    def __init__(self, module, product: Callable[[nn.Linear], nn.Module] | None, layer_module, wide_target: bool):
        super().__init__(host_paths=True)
        self.module, self._product, self.layer_module = module, product, layer_module
        self.wide_target = wide_target

    def top_k_rows(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """One native pass where x is a float32 CPU matrix without NaN, equal values in index order (k = 1 is
        torch.argmax's first maximum); else ATen's."""
        if self.module is not None and self.on_host(x) and x.dtype == torch.float32 and x.dim() == 2:
            values, indices, unordered = self.module.row_topk(x.contiguous(), k)
            if not bool(unordered):
                return values, indices
        return super().top_k_rows(x, k)

    def move_rows(self, tensors: list[Tensor], committed: int, rows: Tensor) -> bool:
        # one native call moves every layer's rows, where ATen would take an indexed copy per cache tensor
        if self.module is None or not self.on_host(tensors[0]):
            return False
        self.module.move_rows(tensors, committed, rows.cpu())
        return True

    def product(self, linear: nn.Linear) -> nn.Module | None:
        return None if self._product is None else self._product(linear)

    def draft_layer(self, head) -> NativeHeadLayer | None:
        if self.layer_module is None or not NativeHeadLayer.applies(head):
            return None
        return NativeHeadLayer(head, self.layer_module, self.top_k_rows)

    def draft_head_dtype(self) -> str | None:
        """bfloat16 for a float32 target whose build multiplies bfloat16 weights in its panels (half the bytes a
        draft level reads; docs/cpu_engine.md has the measurements), else the target's dtype."""
        wide = self.wide_target and self.layer_module is not None and self.layer_module.bfloat16_panels_supported()
        return "bfloat16" if wide else None

    def product_record(self, products: list[nn.Module]) -> dict:
        return widened_record(products)
