"""Fast CPU forward paths, chosen by `hardware.fast_path`, used by the baseline and every method alike.

On a CPU a decode step is bound by reading the weights once; what decides its speed is which GEMM
kernel the small-row products hit. `F.linear(x, W)` with W stored [out, in] takes a slow path for 1-2
rows, while `x @ W_t` with W_t stored [in, out] contiguous streams the weight once (docs/cpu_engine.md).
`transposed` swaps every nn.Linear (the LM head included) for that layout;
`packed` keeps oneDNN-packed weights for several rows; `bf16` additionally halves the bytes read (the
baseline runs in bf16 too, so losslessness is against the bf16 target). The products run inside the
lean backend (graft/cpu/lean.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import statistics
import time
from typing import Callable

import torch
from torch import Tensor, nn

from graft.layers import ATTENTION_NAME, graft_mask, grouped_sdpa


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, graft_mask)


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
    """A product on weights laid out once for the CPU's small-row kernels.

    `packed` is oneDNN's blocked layout, which keeps products of a few rows (a verification) near the
    streaming rate. Up to `small_rows` rows a second layout, `small`, is read instead, where one was measured
    faster at load:
    - x @ W_t from a contiguous transposed copy (`single_row_t`) for one row (a decode step) in fp32: whether
      it or oneDNN is faster depends on the CPU, so `choose_one_row_kernel` times both and keeps one;
    - graft/cpu/native's panel kernel (`panels`, [N / B, K, B]; native/panels.h says why) for fp32 on AVX-512F
      or AVX2 + FMA,
      given the built module; `choose_product_kernel` settles up to how many rows it serves, or that it serves
      every row count (oneDNN's copy dropped: `packed` is then the panels).
    bfloat16 weights go to the native build's bfloat16 panels for every row count where it has them
    (`narrow_panels`; native/products.cpp: bfloat16_panel_products), else to oneDNN:
    - AVX2 ("widened"): where oneDNN packs no bf16 (or fp16) on this CPU (it needs avx512bw/vl/dq or
      avx_ne_convert) torch's bfloat16 product is a reference loop, far slower than fp32.
      The panels widen each weight to float32 in the registers: the float32 panels' bits for the widened
      weights, at half the bytes streamed.
    - AVX512-BF16 ("dot"): activations rounded to bfloat16 as oneDNN's bfloat16 products round them, k pairs
      multiplied and added by vdpbf16ps: twice the multiply-adds an instruction of the float32 panels.
    Without them (no native build, float16, product_kernel=onednn) weights oneDNN cannot multiply are held in
    float32, the same values (`widened_from` names their dtype), and run as the fp32 products. Inputs and
    outputs keep the caller's dtype. docs/cpu_engine.md has what each layout measured.
    """

    def __init__(
        self,
        linear: nn.Linear,
        batch_hint: int = 16,
        one_row: str | None = None,
        products: dict | None = None,
        native_module=None,
    ):
        """`one_row`: the one-row kernel already settled ("packed" keeps no transposed copy); `products`: the
        product kernel already settled (choose_product_kernel's record: its "products", "panel_rows" and
        "tile_prefetch"); None: keep every candidate until choose_one_row_kernel / choose_product_kernel measure
        them."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().contiguous()
        kernel = (products or {}).get("products")
        may_pack_panels = kernel != "onednn" and native_module is not None
        # a target whose products are all bfloat16 panels (packed_bf16) settles no float32 kernel ("onednn" for
        # its float32 products) but keeps the bfloat16 panels for the products settled with it (a draft head's)
        narrow_allowed = native_module is not None and (may_pack_panels or (products or {}).get("narrow") == "panel")
        narrow = not onednn_packs(weight.dtype)  # oneDNN has no products for these weights here
        self.narrow_panels = weight.dtype == torch.bfloat16 and narrow_allowed and panels_apply(native_module, weight)
        self.widened_from = weight.dtype if narrow and not self.narrow_panels else None
        bias = None if linear.bias is None else linear.bias.detach().clone()
        if narrow or self.narrow_panels:  # the panels or the float32 products add a float32 bias
            bias = None if bias is None else bias.float()
        if self.widened_from is not None:
            weight = weight.float()
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.single_row_t, self.panels, self._native, self.onednn = None, None, None, None
        # W_t read for one row beside the panels, where they measured slower there (choose_product_kernel)
        self.one_row = None
        # how the panels' AVX-512F tiles prefetch the weights (native/panels.h: TilePrefetch), passed to each product
        self.tile_prefetch = tile_prefetch_code(**(products or {}).get("tile_prefetch", {}))
        if self.narrow_panels:  # every row count
            self.panels, self._native = native_module.pack_panels(weight), native_module
            self.packed, self.small_rows = self.panels, 0
            return
        if may_pack_panels and weight.dtype == torch.float32 and panels_apply(native_module, weight):
            self.panels, self._native = native_module.pack_panels(weight), native_module
        if kernel == "panel" and self.panels is not None:  # every row count
            self.packed, self.small_rows = self.panels, 0
            return
        self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.packed = self.onednn
        if kernel == "mixed" and self.panels is not None:
            self.small_rows = products["panel_rows"]
            return
        if kernel is not None:
            self.panels = None
        # x @ W_t for one row until choose_one_row_kernel has measured it (or where it was settled so)
        transposed = weight.dtype == torch.float32 and one_row != "packed"
        if transposed:
            self.single_row_t = nn.Parameter(weight.t().contiguous(), requires_grad=False)
        self.small_rows = 1 if transposed else 0

    @property
    def small(self) -> Tensor | None:
        """The layout read up to `small_rows` rows: the panels where they serve few rows, else W_t."""
        if self.panels is not None and self.packed is not self.panels and self.single_row_t is None:
            return self.panels
        return self.single_row_t

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        if self.widened_from is not None:
            flat = flat.float()
        elif self.packed.dim() == 2 and flat.dtype != self.packed.dtype:  # float32 rows, bfloat16 oneDNN weights
            flat = flat.to(self.packed.dtype)
        rows = flat.shape[0]
        if self.one_row is not None and rows == 1:
            small = self.one_row
        else:
            small = self.small if rows <= self.small_rows else None
        if small is not None:
            y = self._panel(flat, small) if small.dim() == 3 else flat @ small
            if small.dim() == 2 and self.bias is not None:
                y = y + self.bias
        elif self.packed.dim() == 3:
            y = self._panel(flat, self.packed)
        else:
            y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def _panel(self, flat: Tensor, panels: Tensor) -> Tensor:
        flat = flat.float()  # the panels take float32 activations (the "dot" ones round them to bfloat16 inside)
        bias = self.bias if self.bias is not None else flat.new_empty(0)
        return self._native.panel_linear(flat.contiguous(), panels, bias, self.tile_prefetch)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bf16PackedLinear(PackedLinear):
    """fast_path=packed_bf16: a PackedLinear on the weights (and bias) rounded to bfloat16, taking and giving the
    caller's float32 rows. The bfloat16 panels multiply them where the build has them (AMX tiles on a CPU with
    AMX-BF16: a verification of 16 rows costs about what a decode step does, both streaming half the bytes of
    float32); elsewhere oneDNN's bfloat16 products, or float32 copies of the rounded values."""

    def __init__(self, linear: nn.Linear, **kwargs):
        rounded = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        rounded.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        if linear.bias is not None:
            rounded.bias = nn.Parameter(linear.bias.detach().to(torch.bfloat16), requires_grad=False)
        super().__init__(rounded, **kwargs)


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs (and so multiplies) weights of `dtype` on this CPU: float32 everywhere, bfloat16
    and float16 only where the CPU has the instructions oneDNN asks for (it says which when it refuses)."""
    if dtype == torch.float32:
        return True
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except RuntimeError:
        return False
    return True


def widened_record(linears: list[nn.Module]) -> dict:
    """For run.json: which products hold their weights in float32 because oneDNN multiplies no narrower dtype
    here, and which multiply bfloat16 ones through the panels, and how (empty where none does)."""
    record = {}
    dtypes = sorted(
        {str(linear.widened_from).removeprefix("torch.") for linear in linears if getattr(linear, "widened_from", None)}
    )
    if dtypes:
        listed = ", ".join(dtypes)
        record["widened"] = f"{listed} weights held in float32: oneDNN has no {listed} products on this CPU"
    narrow = [linear for linear in linears if getattr(linear, "narrow_panels", False)]
    if narrow:
        kind = getattr(narrow[0]._native, "bfloat16_panel_products", lambda: "widened")()
        record["narrow_panels"] = NARROW_PANELS[kind]
    return record


NARROW_PANELS = {  # what run.json says of bfloat16 weights in the panels, by the native module's bfloat16_panel_products
    "widened": "bfloat16 weights multiplied by the panel kernel, widened to float32 in the registers: oneDNN has no "
    "bfloat16 products on this CPU",
    "dot": "bfloat16 weights multiplied by the panel kernel's AVX512-BF16 dot products, activations rounded to "
    "bfloat16 (as oneDNN's bfloat16 products round them)",
    "amx": "bfloat16 weights multiplied by AMX tiles (tdpbf16ps) reading the dot panels, activations rounded to "
    "bfloat16; the dot products where K is not a multiple of 32",
}


def panels_apply(native_module, weight: Tensor) -> bool:
    """Whether the panel kernel takes this weight as it is: on the CPU, out_features divisible by 16, and a
    build with AVX-512F or AVX2 + FMA for float32, the AVX2 or AVX512-BF16 build for bfloat16 (elsewhere
    bfloat16 goes through oneDNN)."""
    supported = {
        torch.float32: native_module.panels_supported,
        torch.bfloat16: getattr(native_module, "bfloat16_panels_supported", lambda: False),
    }.get(weight.dtype)
    return supported is not None and weight.device.type == "cpu" and weight.shape[0] % 16 == 0 and bool(supported())


PRODUCT_KERNELS = ("panel", "onednn")
# a decode step, the verifications of this project's trees (up to 64 rows; longer forwards are prompt chunks)
PRODUCT_ROWS = (1, 2, 4, 8, 16, 32, 64)


def choose_product_kernel(
    linears: list[PackedLinear],
    kernel: str = "auto",
    no_panels: str | None = None,
    repeats: int = 5,
    one_row_kernel: str = "auto",
) -> dict:
    """Settle which rows the panel kernel serves, after the one-row kernel is settled (oneDNN or W_t).

    "auto" times the panels and the settled kernels on these weights in forward order for each of
    PRODUCT_ROWS, alternating over `repeats` rounds after a warm-up round, and gives the panels every row
    count up to `panel_rows_from`'s ("mixed": oneDNN above it, so both copies are kept), or none (their copy
    freed). Where the one-row kernel settled on W_t and the panels measured more than PANEL_TIE slower at one
    row, W_t stays for one row (`one_row`, a third copy) and the panels are judged from two rows, so that a
    loss at one row alone does not hand every row count to oneDNN (panels can lose at one row and win at 2-64).
    A decode step and a verification then add a token's terms in different orders (lossless up to float ties, as with
    oneDNN); within the tie the panels keep one row, and the bits agree. "panel" gives them every row count
    (oneDNN's copy freed; one row stays W_t's where `one_row_kernel`, the config's hardware.one_row_kernel,
    asked for "transposed") and refuses where no linear has panels, "onednn" none. Linears without panels (bf16,
    no native build: `no_panels` says why) keep oneDNN. Returns a record for run.json."""
    if kernel not in ("auto", *PRODUCT_KERNELS):
        raise ValueError(f"hardware.product_kernel={kernel!r}; allowed: auto, {', '.join(PRODUCT_KERNELS)}")
    dual = [linear for linear in linears if linear.panels is not None and linear.onednn is not None]
    if not dual:
        reason = no_panels or "no float32 products the panel kernel takes"
        narrow = any(linear.narrow_panels for linear in linears)
        if kernel == "panel" and not narrow:
            raise ValueError(f"hardware.product_kernel=panel, but {reason}")
        # every product on the bfloat16 panels (packed_bf16): the products settled with these take them too
        return {"products": "onednn", "products_reason": reason, **({"narrow": "panel"} if narrow else {})}
    record: dict = {"products_reason": f"hardware.product_kernel={kernel}"}
    panel_rows = 0 if kernel == "onednn" else max(PRODUCT_ROWS)
    keep_one_row = False
    prefetch = {} if kernel == "onednn" else choose_tile_prefetch(dual)
    if prefetch:  # every product settled here keeps the modes, as do those made from the record (a draft head's)
        _use_tile_prefetch(linears, **prefetch["tile_prefetch"])
    if kernel == "auto":
        settled = {linear: (linear.packed, linear.small_rows) for linear in dual}
        inputs = {rows: {n: torch.randn(rows, n) for n in {lin.in_features for lin in dual}} for rows in PRODUCT_ROWS}

        def use(name: str) -> None:
            for linear in dual:
                linear.packed, linear.small_rows = (linear.panels, 0) if name == "panel" else settled[linear]

        medians = _interleaved_ms(
            PRODUCT_KERNELS,
            use,
            lambda name: {f"{name}@{rows}": _time_products(dual, inputs[rows]) for rows in PRODUCT_ROWS},
            repeats,
        )
        transposed = all(linear.single_row_t is not None for linear in dual)  # the one-row kernel is W_t
        # beyond a tie the panels keep one row too: then a token's logits are the same bits in a decode step and
        # in a verification (W_t's and the panels' sums differ in order), so greedy speculation is exact
        keep_one_row = transposed and medians["panel@1"] > PANEL_TIE * medians["onednn@1"]
        panel_rows = panel_rows_from(medians, first=2 if keep_one_row else 1)
        keep_one_row = keep_one_row and panel_rows > 0
        for linear in dual:
            linear.packed, linear.small_rows = settled[linear]
        record = {"products_reason": "measured at load", "products_ms": {k: round(v, 2) for k, v in medians.items()}}
    for linear in dual:
        if kernel == "panel":
            linear.one_row = linear.single_row_t if one_row_kernel == "transposed" else None
            linear.packed, linear.onednn, linear.single_row_t, linear.small_rows = linear.panels, None, None, 0
        elif panel_rows:
            linear.one_row = linear.single_row_t if keep_one_row else None
            linear.single_row_t, linear.small_rows = None, panel_rows
        else:
            linear.panels = None
    products = "panel" if kernel == "panel" else "mixed" if panel_rows else "onednn"
    if products == "mixed" or kernel == "panel":
        record["one_row_beside_panels"] = any(linear.one_row is not None for linear in dual)
    return {"products": products, "panel_rows": panel_rows if products == "mixed" else None, **record, **prefetch}


# graft/cpu/native/panels.h's TilePrefetch modes, in its order, and the row counts each tile class is timed at:
# products of one tile (up to 8 rows: a decode step, small trees) and of several (16- and 32-node trees), since a
# CPU's best mode can differ between the two
TILE_PREFETCH = ("stream_ahead", "chunk_ahead", "hardware")
PREFETCH_ROWS = {"one_tile": (1, 2, 8), "several_tiles": (16, 32)}


def tile_prefetch_code(one_tile: str = "stream_ahead", several_tiles: str = "stream_ahead") -> int:
    """The panel products' `prefetch` argument for these modes (panels.h: the one-tile mode in bits 0-1, the
    several-tile mode in bits 2-3)."""
    return TILE_PREFETCH.index(one_tile) | TILE_PREFETCH.index(several_tiles) << 2


def choose_tile_prefetch(linears: list[PackedLinear], repeats: int = 5) -> dict:
    """Settle how the AVX-512F panel tiles prefetch their weights (graft/cpu/native/panels.h: TilePrefetch), for
    products of one tile and of several apart: time the panels of these linears in forward order in each mode at
    each class's PREFETCH_ROWS, alternating over `repeats` rounds after a warm-up round, and keep per class the
    mode with less time in all, in each linear's `tile_prefetch` (every panel product passes its own). The modes
    never change a product's bits. Returns a record for run.json (a product made from it takes its modes); {}
    where the build has no modes (AVX2, generic, no native build)."""
    module = next((linear._native for linear in linears if linear._native is not None), None)
    if module is None or not module.tile_prefetch_supported():
        return {}
    settled = {linear: (linear.packed, linear.small_rows) for linear in linears}
    counts = sorted({rows for rows_of in PREFETCH_ROWS.values() for rows in rows_of})
    inputs = {rows: {n: torch.randn(rows, n) for n in {lin.in_features for lin in linears}} for rows in counts}

    def time_round(mode: str) -> dict[str, float]:
        return {
            f"{mode}@{name}": sum(_time_products(linears, inputs[rows]) for rows in rows_of)
            for name, rows_of in PREFETCH_ROWS.items()
        }

    try:
        for linear in linears:
            linear.packed, linear.small_rows = linear.panels, 0
        medians = _interleaved_ms(
            TILE_PREFETCH, lambda mode: _use_tile_prefetch(linears, mode, mode), time_round, repeats
        )
    finally:
        for linear in linears:
            linear.packed, linear.small_rows = settled[linear]
    chosen, times = {}, {}
    for name in PREFETCH_ROWS:
        times[name] = {mode: round(medians[f"{mode}@{name}"], 2) for mode in TILE_PREFETCH}
        chosen[name] = min(TILE_PREFETCH, key=lambda mode: medians[f"{mode}@{name}"])
    _use_tile_prefetch(linears, chosen["one_tile"], chosen["several_tiles"])
    return {"tile_prefetch": chosen, "tile_prefetch_ms": times}


def _use_tile_prefetch(linears: list[PackedLinear], one_tile: str, several_tiles: str) -> None:
    code = tile_prefetch_code(one_tile, several_tiles)
    for linear in linears:
        linear.tile_prefetch = code


PANEL_TIE = 1.05  # the panels may measure up to 5% slower at one row count (load-time timing noise) and keep it


def panel_rows_from(medians: dict[str, float], first: int = 1) -> int:
    """The largest measured row count r such that, over the counts from `first` up to r, the panels took less
    time in all than oneDNN and were nowhere more than PANEL_TIE slower; 0 where there is none. Summing over the
    prefix keeps one noisy tie at a small count from handing every larger count to oneDNN, as a rule where each
    count must win outright did. (`first` 2: one row is W_t's.)"""
    best = 0
    counts = [rows for rows in PRODUCT_ROWS if rows >= first]
    for index, rows in enumerate(counts):
        upto = counts[: index + 1]
        if any(medians[f"panel@{r}"] > PANEL_TIE * medians[f"onednn@{r}"] for r in upto):
            break
        if sum(medians[f"panel@{r}"] for r in upto) < sum(medians[f"onednn@{r}"] for r in upto):
            best = rows
    return best


def _time_products(linears: list[PackedLinear], inputs: dict[int, Tensor]) -> float:
    start = time.perf_counter()
    for linear in linears:
        linear(inputs[linear.in_features])
    return time.perf_counter() - start


def _interleaved_ms(
    names: tuple[str, ...], use: Callable[[str], None], time_round: Callable[[str], dict[str, float]], repeats: int
) -> dict[str, float]:
    """Median milliseconds per key of `time_round(name)` ({key: seconds}) after `use(name)`, over `repeats`
    rounds in which every name runs in turn, the order alternating by round so that none always runs first;
    one more round before them warms every name up and is not counted."""
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        for round_index in range(repeats + 1):
            for name in names if round_index % 2 == 0 else names[::-1]:
                use(name)
                for key, seconds in time_round(name).items():
                    samples = times.setdefault(key, [])  # keys in the warm-up round's order
                    if round_index:
                        samples.append(seconds)
    return {key: statistics.median(values) * 1e3 for key, values in times.items()}


ONE_ROW_KERNELS = ("transposed", "packed")


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
        medians = _interleaved_ms(
            ONE_ROW_KERNELS,
            lambda name: _use_one_row(dual, name),
            lambda name: {name: _time_products(dual, rows)},
            repeats,
        )
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
        linear.small_rows = 1 if kernel == "transposed" else 0


def apply_fast_path(model: nn.Module, mode: str):
    """Prepare `model` for the lean backend in `mode`; returns (model, make_linear).

    'transposed': products as x @ W_t. 'packed': oneDNN-packed products (x @ W_t for one row).
    'bf16': 'packed' in bfloat16. 'packed_bf16': 'packed' with the products' weights in bfloat16, the rest float32.
    """
    on_cpu = next(model.parameters()).device.type == "cpu"
    if on_cpu:
        keep_freed_memory()
    if mode in ("packed", "packed_bf16", "bf16") and (not on_cpu or not torch.backends.mkldnn.is_available()):
        raise ValueError(f"hardware.fast_path='{mode}' needs a CPU build of torch with oneDNN (mkldnn)")
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    register_attention()
    model.config._attn_implementation = ATTENTION_NAME
    return model, {"transposed": TransposedLinear, "packed_bf16": Bf16PackedLinear}.get(mode, PackedLinear)
