"""Fast CPU forward paths, chosen by `hardware.fast_path`, used by the baseline and every method alike.

On a CPU a decode step is bound by reading the weights once; what decides its speed is which GEMM
kernel the small-row products hit. `F.linear(x, W)` with W stored [out, in] takes a slow path for 1-2
rows, while `x @ W_t` with W_t stored [in, out] contiguous streams the weight once (measured in
scripts/bench_forward.py). `transposed` swaps every nn.Linear (the LM head included) for that layout;
`packed` keeps oneDNN-packed weights for several rows; `bf16` additionally halves the bytes read (the
baseline runs in bf16 too, so losslessness is against the bf16 target). The products run inside the
lean backend (graft/backends/lean.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time

import torch
from torch import Tensor, nn

from graft.nn import grouped_sdpa

ATTENTION_NAME = "graft_sdpa"


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


def keep_freed_memory() -> None:
    """Stop glibc from returning large freed blocks to the kernel after every forward.

    Activations above glibc's mmap threshold are mapped and unmapped on each use, so every step pays
    page faults on fresh pages; raising the thresholds makes them reuse the heap. Linux/glibc only.
    """
    path = ctypes.util.find_library("c")
    if not path:
        return
    libc = ctypes.CDLL(path)
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


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


class PackedLinear(nn.Module):
    """oneDNN's linear on weights reordered once into its blocked layout, which keeps small-row products
    (a verification of a few tokens) close to the streaming rate. For a single row (a decode step) in fp32,
    x @ W_t from a contiguous transposed copy is faster on some CPUs (an Intel Xeon here) and much slower
    on others (an AMD Zen 5: 23.6 ms against 11.4 ms for a decode step's products), so fp32 keeps both until
    `choose_one_row_kernel` has measured which is faster and dropped the loser; bf16 uses oneDNN
    (avx512_bf16 dot products) for every row count."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 16, one_row: str | None = None):
        """`one_row`: a kernel already settled for these products ("packed" keeps no transposed copy);
        None: keep both until choose_one_row_kernel measures them."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().contiguous()
        self.single_row_t = None
        self.one_row_transposed = one_row != "packed"  # switched while choose_one_row_kernel measures
        if weight.dtype == torch.float32 and one_row != "packed":
            self.single_row_t = nn.Parameter(weight.t().contiguous(), requires_grad=False)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        if flat.shape[0] == 1 and self.single_row_t is not None and self.one_row_transposed:
            y = flat @ self.single_row_t
            if self.bias is not None:
                y = y + self.bias
        else:
            y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


ONE_ROW_KERNELS = ("transposed", "packed")


def _time_one_row(linears: list[PackedLinear], rows: dict[int, Tensor]) -> float:
    start = time.perf_counter()
    for linear in linears:
        linear(rows[linear.in_features])
    return time.perf_counter() - start


def choose_one_row_kernel(linears: list[PackedLinear], kernel: str = "auto", repeats: int = 7) -> dict:
    """Settle the one-row product of every fp32 PackedLinear: x @ W_t ("transposed") or oneDNN ("packed").

    "auto" measures both on these weights, in the order a decode step reads them (so the weights stream
    from memory as they do in a step), alternating kernels over `repeats` rounds after one warm-up round,
    and keeps the faster by median; the loser's weight copy is freed. Returns what was chosen and why,
    for run.json."""
    if kernel not in ("auto", *ONE_ROW_KERNELS):
        raise ValueError(f"hardware.one_row_kernel={kernel!r}; allowed: auto, {', '.join(ONE_ROW_KERNELS)}")
    dual = [linear for linear in linears if linear.single_row_t is not None]
    if not dual:
        return {"one_row": "packed", "reason": "oneDNN for every row count (no fp32 transposed copy)"}
    record: dict = {}
    if kernel == "auto":
        rows = {linear.in_features: torch.randn(1, linear.in_features) for linear in dual}
        times: dict[str, list[float]] = {name: [] for name in ONE_ROW_KERNELS}
        with torch.inference_mode():
            for round_index in range(repeats + 1):
                order = ONE_ROW_KERNELS if round_index % 2 == 0 else ONE_ROW_KERNELS[::-1]
                for name in order:
                    _use_one_row(dual, name)
                    elapsed = _time_one_row(dual, rows)
                    if round_index:  # the first round warms both kernels up
                        times[name].append(elapsed)
        medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
        kernel = min(medians, key=medians.get)
        record = {"reason": "measured at load", "one_row_products_ms": {k: round(v, 2) for k, v in medians.items()}}
    else:
        record = {"reason": "hardware.one_row_kernel"}
    _use_one_row(dual, kernel)
    if kernel == "packed":
        for linear in dual:
            linear.single_row_t = None  # frees the transposed copy
    return {"one_row": kernel, **record}


def _use_one_row(linears: list[PackedLinear], kernel: str) -> None:
    for linear in linears:
        linear.one_row_transposed = kernel == "transposed"


def apply_fast_path(model: nn.Module, mode: str):
    """Prepare `model` for the lean backend in `mode`; returns (model, make_linear).

    'transposed': products as x @ W_t. 'packed': oneDNN-packed products (x @ W_t for one row).
    'bf16': 'packed' in bfloat16.
    """
    on_cpu = next(model.parameters()).device.type == "cpu"
    if on_cpu:
        keep_freed_memory()
    if mode in ("packed", "bf16") and (not on_cpu or not torch.backends.mkldnn.is_available()):
        raise ValueError(f"hardware.fast_path='{mode}' needs a CPU build of torch with oneDNN (mkldnn)")
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    register_attention()
    model.config._attn_implementation = ATTENTION_NAME
    return model, TransposedLinear if mode == "transposed" else PackedLinear
