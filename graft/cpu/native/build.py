"""Native (C++) pieces of the CPU fast path, built with torch's extension builder once per machine and variant.

`lean_layers` runs the lean forward's layer loop for a few rows and `head_layer` an EAGLE head's decoder layer
(layers.cpp says why); `pack_panels` / `panel_linear` are the panel kernel for float32 products of few rows
(graft/cpu/products.py decides at load which row counts it serves), and in the AVX2 and AVX512-BF16 builds for
bfloat16 weights too; rows.cpp holds the row helpers (top-k, logsumexp, moves of cache rows), rates.cpp the
arithmetic roofs the forward profile reports.

The sources (module.cpp, which includes the others: one translation unit) are compiled once per instruction-set
variant (VARIANTS), each with explicit -m flags rather than -march=native, so that a build depends on its variant
and never on the machine that compiled it. `load()` builds only the variant it returns: the best one this CPU
executes (its /proc/cpuinfo flags), or the one $GRAFT_NATIVE_VARIANT names; `load(variant)` gives a given one, and
`build()` compiles variants without loading them. Builds live in $GRAFT_CACHE/native/<variant>-<key>, the key
covering the sources, torch's version and the variant's flags. Building needs a C++ compiler (and ninja); where
the build fails, `load()` says why (`failure()`) and the Python loop and oneDNN's products run instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).parent
ENV_VARIANT = "GRAFT_NATIVE_VARIANT"  # a variant's name: load() builds and returns that one instead of the best


@dataclass(frozen=True)
class Variant:
    flags: tuple[str, ...]  # the compiler's instruction-set flags, beside COMMON_FLAGS
    cpu: tuple[str, ...]  # the /proc/cpuinfo flags a CPU needs to execute the build


COMMON_FLAGS = ("-O3", "-fopenmp", "-fvisibility=hidden")
# auto-vectorised loops (the RMSNorm's sum of squares) in 8 floats on every x86 variant: the order of their
# float sums must not change with the CPU's tuning
_X86 = ("-mpopcnt", "-mprefer-vector-width=256")
_AVX2 = (*_X86, "-mavx2", "-mfma")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
_AVX512_CPU = ("popcnt", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq")
# least to most capable; the generic build (scalar loops, SDPA, oneDNN's products) runs on any CPU
VARIANTS = {
    "generic": Variant(flags=(), cpu=()),
    "avx2": Variant(flags=_AVX2, cpu=("popcnt", "avx2", "fma")),
    "avx512": Variant(flags=_AVX512, cpu=_AVX512_CPU),
    "avx512bf16": Variant(flags=(*_AVX512, "-mavx512bf16"), cpu=(*_AVX512_CPU, "avx512_bf16")),
    "amx": Variant(flags=(*_AVX512, "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
                   cpu=(*_AVX512_CPU, "avx512_bf16", "amx_tile", "amx_bf16")),
}  # fmt: skip

# the order of a layer's tensors in lean_layers' `weights` (an empty tensor where one is absent)
# (layers.cpp's LayerField names the same indices)
LAYER_FIELDS = (
    "input_norm",
    "qkv.packed", "qkv.small", "qkv.one_row", "qkv.bias",
    "o.packed", "o.small", "o.one_row", "o.bias",
    "post_norm",
    "gate_up.packed", "gate_up.small", "gate_up.one_row", "gate_up.bias",
    "down.packed", "down.small", "down.one_row", "down.bias",
    "qk_norm",
)  # fmt: skip
# a layer's products in the order of their tile prefetch modes in lean_layers' and head_layer's `prefetch`
PRODUCTS = ("qkv", "o", "gate_up", "down")

_PRODUCT_TENSORS = {"packed": "packed", "small": "small", "one_row": "one_row", "bias": "bias"}  # PackedLinear's

_modules: dict[str, object] = {}  # built and loaded, by variant
_failures: dict[str, str] = {}  # why a variant did not build or load
_best: str | None = None  # the variant load() settled on where no variant is named


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


def layer_prefetch(parts: dict) -> list[int]:
    """One layer's products' tile prefetch modes (PackedLinear.tile_prefetch) in PRODUCTS order, 0 where absent."""
    return [getattr(parts.get(name), "tile_prefetch", 0) for name in PRODUCTS]


def small_rows(product) -> int:
    """Up to how many rows a PackedLinear (and every product settled with it) reads its small-row layout."""
    return product.small_rows if product.small is not None else 0


def sources() -> list[Path]:
    """The file torch's builder compiles: module.cpp, which includes the others (every .cpp and .h beside it is
    part of the build key)."""
    return [SOURCE_DIR / "module.cpp"]


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def runnable(variant: str) -> bool:
    """Whether this CPU executes `variant`'s build (every build but the generic one needs an x86 CPU)."""
    needs = VARIANTS[_checked(variant)].cpu
    return not needs or (_x86() and set(needs) <= _cpu_flags())


def buildable() -> list[str]:
    """The variants this machine's compiler may build, whether or not its CPU executes them: all on x86."""
    return list(VARIANTS) if _x86() else ["generic"]


def best_variant() -> str:
    """The most capable variant this CPU executes."""
    return next(variant for variant in reversed(VARIANTS) if runnable(variant))


def _checked(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"graft/cpu/native has no variant {variant!r}; the variants: {', '.join(VARIANTS)}")
    return variant


def build_key(variant: str | None = None) -> str:
    """What a build of `variant` (None: the one load() picks) depends on: the sources, torch's version, the flags."""
    import torch

    variant = _checked(variant or _named() or best_variant())
    digest = hashlib.sha256()
    for path in sorted([*SOURCE_DIR.glob("*.cpp"), *SOURCE_DIR.glob("*.h")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    flags = [*COMMON_FLAGS, *VARIANTS[variant].flags]
    for part in (torch.__version__, variant, " ".join(flags), platform.machine()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def build_directory(variant: str) -> Path:
    from graft.hub import cache_root

    return cache_root() / "native" / f"{variant}-{build_key(variant)}"


def _torch_build(variant: str, verbose: bool = False, is_python_module: bool = True):
    """torch's extension builder on `variant` (a no-op where its build is current); the module, or with
    `is_python_module` False the library's path, loaded by dlopen alone."""
    # torch's builder runs `ninja` from PATH: the one installed beside this interpreter (pip's ninja) first
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    from torch.utils.cpp_extension import load as build

    directory = build_directory(variant)
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob("*.so")):
        log.info("building graft/cpu/native (%s) into %s (once per machine)", variant, directory)
    return build(
        name=f"graft_native_{variant}_{directory.name.rpartition('-')[2]}",
        sources=[str(path) for path in sources()],
        # OpenMP: at::parallel_for splits the panel kernel's blocks between threads; the library resolves to the
        # libgomp torch already loaded (same soname), so there is one thread pool
        extra_cflags=[*COMMON_FLAGS, *VARIANTS[variant].flags],
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
        verbose=verbose,
        is_python_module=is_python_module,
    )


def _reason(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"


def _named() -> str | None:
    return os.environ.get(ENV_VARIANT) or None


def load(variant: str | None = None, verbose: bool = False):
    """The built module of `variant`, or None with the reason in `failure(variant)`; each variant is built at most
    once per process. Without a variant: the one $GRAFT_NATIVE_VARIANT names, else the best this CPU executes (a
    lesser one where that fails to build)."""
    global _best
    if variant is None:
        if _named() is not None:
            return load(_named(), verbose)
        if _best is None:
            candidates = [name for name in reversed(VARIANTS) if runnable(name)]
            _best = next((name for name in candidates if load(name, verbose) is not None), candidates[0])
            if _best != candidates[0]:
                log.warning("graft/cpu/native: the %s build runs, the %s one failed", _best, candidates[0])
        return _modules.get(_best)
    if variant in _modules or variant in _failures:
        return _modules.get(variant)
    _checked(variant)  # a name that is no variant is the caller's error, not a failed build
    try:
        if not runnable(variant):
            raise RuntimeError(
                f"this CPU cannot execute the {variant} build (it lacks {', '.join(VARIANTS[variant].cpu)})"
            )
        _modules[variant] = _torch_build(variant, verbose)
    except Exception as err:  # no compiler, no ninja, a failed build: the Python loop runs instead
        _failures[variant] = _reason(err)
    return _modules.get(variant)


def _default() -> str | None:
    return _named() or _best


def loaded():
    """The module load() returns where this process has already loaded it, else None; never starts a build
    (helpers that any path may call, such as graft.cpu.ops' top-k, use it only where a fast path loaded it)."""
    variant = _default()
    return None if variant is None else _modules.get(variant)


def failure(variant: str | None = None) -> str | None:
    """Why `variant` (None: load()'s) did not build or load, or None."""
    variant = variant or _default()
    return None if variant is None else _failures.get(variant)


def unavailable() -> str | None:
    """Why the native module cannot be used here (the build failed), or None where it loads."""
    return None if load() is not None else f"the native build failed ({failure()})"


def build(variants: list[str] | None = None, jobs: int | None = None) -> dict[str, str | None]:
    """Compile `variants` (None: every one this machine's compiler may build) without importing them, those not
    built yet at once in their own processes, a CPU that cannot execute a variant surviving its build; returns
    each variant's error, None where it built. load(variant) then imports a built one this CPU executes."""
    variants = buildable() if variants is None else [_checked(variant) for variant in variants]
    todo = [variant for variant in variants if not any(build_directory(variant).glob("*.so"))]
    env = {**os.environ, "MAX_JOBS": str(jobs or max(1, (os.cpu_count() or 1) // max(1, len(todo))))}
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE_DIR.parents[2]), env.get("PYTHONPATH", "")])  # graft importable
    script = "import sys; from graft.cpu.native import build as native; native._torch_build(sys.argv[1], is_python_module=False)"
    running = {
        variant: subprocess.Popen(
            [sys.executable, "-c", script, variant],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for variant in todo
    }
    errors: dict[str, str | None] = dict.fromkeys(variants)
    for variant, process in running.items():
        output, _ = process.communicate()
        if not any(build_directory(variant).glob("*.so")):  # built, even where the CPU then refused to load it
            errors[variant] = f"exit status {process.returncode}: " + "\n".join(output.strip().splitlines()[-20:])
    return errors
