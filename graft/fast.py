"""Fast CPU forward paths, chosen by `hardware.fast_path`, used by the baseline and every method alike.

On a CPU a decode step is bound by reading the weights once; what decides its speed is which GEMM
kernel the small-row products hit. `F.linear(x, W)` with W stored [out, in] takes a slow path for 1-2
rows, while `x @ W_t` with W_t stored [in, out] contiguous streams the weight once (measured in
scripts/bench_forward.py). `transposed` swaps every nn.Linear (the LM head included) for that layout;
`bf16` additionally halves the bytes read (the baseline runs in bf16 too, so losslessness is against
the bf16 target); `compile` adds torch.compile (inductor) on top where it pays.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TransposedLinear(nn.Module):
    """y = x @ W_t + b with W_t = W.T stored contiguous; numerically the same product as nn.Linear."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def transpose_linears(model: nn.Module) -> int:
    """Replace every nn.Linear in `model` by a TransposedLinear; returns how many were replaced.

    A tied LM head gets its own transposed copy (the embedding keeps the row layout it needs for lookup).
    """
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, TransposedLinear(child))
                count += 1
    return count


def apply_fast_path(model: nn.Module, mode: str) -> nn.Module:
    """mode: 'none' | 'transposed' | 'bf16' | 'compile' (transposed + torch.compile)."""
    if mode == "none":
        return model
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    transpose_linears(model)
    if mode == "compile":
        model.forward = torch.compile(model.forward, dynamic=True)
    return model
