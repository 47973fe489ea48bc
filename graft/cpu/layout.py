"""What the CPU engine keeps beside a model's weights, for the memory plan (graft/plan/memory.py): the layouts each
hardware.fast_path builds (graft/cpu/products.py) and the dtype its products run in."""

from __future__ import annotations


def fast_path_layout(fast_path: str, dtype: str, device_type: str, hardware=None) -> tuple[str, int, str]:
    """(dtype the weights run in, extra copies of the dense weights, why) for hardware.fast_path.

    The lean backend keeps the model's own weights and builds its layouts beside them (graft/cpu/products.py):
    `transposed` one W_t copy; `packed` in float32 a oneDNN-packed copy and a small-row one (W_t, or the
    panel kernel's layout), and W_t beside the panels where it measured faster at one row: up to three (all
    three are held for a moment while the kernels are measured at load); `packed` in
    bfloat16 and `bf16` (the model cast to bfloat16 first) one packed copy. Where oneDNN has no bfloat16
    products, one panel copy where the AVX2 build's bfloat16 panels will take them (`hardware`, the config,
    says whether they may: narrow_panels_expected), else float32 copies."""
    if fast_path == "none" or (fast_path != "transposed" and device_type != "cpu"):
        return dtype, 0, ""  # packed and bf16 are CPU-only: load_model refuses them on a GPU
    if fast_path == "transposed":
        return dtype, 1, "fast_path=transposed keeps a W_t copy"
    run_dtype = "bfloat16" if fast_path in ("bf16", "packed_bf16") else dtype
    if run_dtype != "float32" and not _onednn_multiplies(run_dtype):
        if run_dtype == "bfloat16" and hardware is not None and narrow_panels_expected(hardware):
            return run_dtype, 1, f"fast_path={fast_path}: no bfloat16 products in oneDNN on this CPU, bfloat16 panels"
        # graft/cpu/products.PackedLinear holds them in float32: a packed and a small-row copy at twice the bytes each
        return run_dtype, 4, f"fast_path={fast_path}: no {run_dtype} products in oneDNN on this CPU, float32 copies"
    if fast_path == "bf16":
        return "bfloat16", 1, "fast_path=bf16 keeps a packed copy"
    if fast_path == "packed_bf16":  # the model's own weights stay in their dtype beside a bfloat16 copy
        return dtype, 1, "fast_path=packed_bf16 keeps a bfloat16 packed copy beside the model's weights"
    if dtype == "float32":
        return dtype, 3, "fast_path=packed in float32 keeps a packed copy, the panels and W_t (up to three)"
    return dtype, 1, "fast_path=packed keeps a packed copy"


def narrow_panels_expected(hardware) -> bool:
    """Whether graft/cpu/products.PackedLinear will put bfloat16 weights in the AVX2 build's bfloat16 panels (on a
    CPU where oneDNN has none): the native build loads here with them and the config does not rule it out."""
    if hardware.native == "off" or hardware.product_kernel == "onednn":
        return False
    from graft.cpu.native import build as native

    module = native.load()
    return module is not None and bool(getattr(module, "bfloat16_panels_supported", lambda: False)())


def _onednn_multiplies(dtype: str) -> bool:
    import torch

    from graft.cpu.products import onednn_packs

    return onednn_packs(getattr(torch, dtype))
