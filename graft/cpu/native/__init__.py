"""Native (C++) pieces of the CPU fast path, built once per machine with torch's extension builder.

`lean_layers` runs the lean forward's layer loop for a few rows and `head_layer` an EAGLE head's decoder
layer (lean_layers.cpp says why); on AVX-512F (or AVX2 with FMA: the same kernels in 8-float vectors),
`pack_panels` / `panel_linear` are the panel kernel for float32
products of few rows (graft/cpu/products.py decides at load which row counts it serves), and in the AVX2 build for
bfloat16 weights too, widened in the registers, where oneDNN has no bfloat16 products. It is built on first use
into $GRAFT_CACHE/native/<key>, the key covering the source, torch's version and this CPU's flags (the build
uses -march=native), so a cache shared between machines never loads another CPU's build. Building needs a C++
compiler; where there is none, `load()` says why and the Python loop and oneDNN's products run instead.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("lean_layers.cpp")

# the order of a layer's tensors in lean_layers' `weights` (an empty tensor where one is absent)
# (lean_layers.cpp's LayerField names the same indices)
LAYER_FIELDS = (
    "input_norm",
    "qkv.packed", "qkv.small", "qkv.one_row", "qkv.bias",
    "o.packed", "o.small", "o.one_row", "o.bias",
    "post_norm",
    "gate_up.packed", "gate_up.small", "gate_up.one_row", "gate_up.bias",
    "down.packed", "down.small", "down.one_row", "down.bias",
    "qk_norm",
)  # fmt: skip

_PRODUCT_TENSORS = {"packed": "packed", "small": "small", "one_row": "one_row", "bias": "bias"}  # PackedLinear's

_module = None
_failure: str | None = None


def layer_weights(parts: dict) -> list:
    """One layer's tensors in LAYER_FIELDS order, from `parts`: input_norm, post_norm and qk_norm a tensor (or
    absent / None), qkv, o, gate_up and down a graft.cpu.products.PackedLinear; an empty tensor where one is absent."""
    import torch

    empty, weights = torch.empty(0), []
    for field in LAYER_FIELDS:
        part, _, kind = field.partition(".")
        value = parts.get(part)
        if kind and value is not None:
            value = getattr(value, _PRODUCT_TENSORS[kind])
        weights.append(empty if value is None else value.detach())
    return weights


def small_rows(product) -> int:
    """Up to how many rows a PackedLinear (and every product settled with it) reads its small-row layout."""
    return product.small_rows if product.small is not None else 0


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_key() -> str:
    import torch

    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), _cpu_flags().encode(), platform.machine().encode()):
        digest.update(part)
    return digest.hexdigest()[:16]


def load(verbose: bool = False):
    """The built module, or None with the reason in `failure()`; built at most once per process."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    # torch's builder runs `ninja` from PATH: the one installed beside this interpreter (pip's ninja) first
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    try:
        from torch.utils.cpp_extension import load as build

        from graft.embedded import cache_root

        key = build_key()
        directory = cache_root() / "native" / key
        directory.mkdir(parents=True, exist_ok=True)
        if not any(directory.glob("*.so")):
            print(f"building graft/cpu/native into {directory} (once per machine, about 20 s)", file=sys.stderr)
        _module = build(
            name=f"graft_lean_layers_{key}",
            sources=[str(SOURCE)],
            # OpenMP: at::parallel_for splits the panel kernel's blocks between threads; the library resolves to the
            # libgomp torch already loaded (same soname), so there is one thread pool
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=verbose,
        )
    except Exception as err:  # no compiler, no ninja, a failed build: the Python loop runs instead
        _failure = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
    return _module


def loaded():
    """The module where this process has already loaded it, else None; never starts a build (helpers that any
    path may call, such as graft.cpu.products.top_k_rows, use it only where a fast path loaded it)."""
    return _module


def failure() -> str | None:
    return _failure


def unavailable() -> str | None:
    """Why the native module cannot be used here (the build failed), or None where it loads."""
    return None if load() is not None else f"the native build failed ({failure()})"
