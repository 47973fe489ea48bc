"""graft/cpu/native's instruction-set variants (graft/cpu/native/build.py: VARIANTS). Every variant this machine's
compiler builds is compiled, whether or not this CPU executes it (all of them with gcc on x86-64), and every one
this CPU executes is checked: its panel products against torch's, and bit for bit against the other variants' and
themselves at every row count (each accumulator adds its k terms in order); its layer loop against the Python
loop, with a token's logits the same bits in a verification as in decode steps; top-k in torch's order; the row
helpers; a commit's moves of cache rows."""

import functools
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from graft.cpu.native import build as native
from graft.tree import DraftTree, topology

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler to build graft/cpu/native"
)

RUNNABLE = [variant for variant in native.VARIANTS if native.runnable(variant)]
VECTOR = [variant for variant in RUNNABLE if variant != "generic"]  # the ones with the panel kernel
PREFETCH_MODES = ("avx512", "avx512bf16", "amx")
BFLOAT16_PANELS = {"generic": "", "avx2": "widened", "avx512": "", "avx512bf16": "dot", "amx": "amx"}


@pytest.fixture(scope="module")
def built() -> dict:
    """Every variant the compiler builds, compiled at once in their own processes (the cache keeps them)."""
    return native.build()


@pytest.fixture(params=RUNNABLE)
def module(request, built):
    assert built[request.param] is None, built[request.param]
    loaded = native.load(request.param)
    assert loaded is not None, native.failure(request.param)
    assert loaded.variant() == request.param  # its flags took: the build says what it was compiled for
    return loaded


def test_every_variant_the_compiler_builds_compiles(built):
    assert list(built) == native.buildable()
    assert {variant: error for variant, error in built.items() if error} == {}
    if native._x86():
        assert list(built) == list(native.VARIANTS)


def test_load_takes_the_best_variant_this_cpu_executes_or_the_one_named(monkeypatch):
    monkeypatch.delenv(native.ENV_VARIANT, raising=False)
    assert native.best_variant() == RUNNABLE[-1] and native.load().variant() == RUNNABLE[-1]
    assert native.loaded() is native.load()
    monkeypatch.setenv(native.ENV_VARIANT, RUNNABLE[0])
    assert native.load() is native.load(RUNNABLE[0]) and native.loaded() is native.load()
    with pytest.raises(ValueError, match="no variant 'sse'"):
        native.load("sse")
    if native._x86():  # what each CPU would take, from its /proc/cpuinfo flags
        monkeypatch.setattr(native, "_cpu_flags", lambda: {"popcnt", "avx2", "fma"})  # an AMD Zen 3
        assert [v for v in native.VARIANTS if native.runnable(v)] == ["generic", "avx2"]
        zen4 = {"popcnt", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
        monkeypatch.setattr(native, "_cpu_flags", lambda: zen4)
        assert native.best_variant() == "avx512bf16"
        monkeypatch.setattr(native, "_cpu_flags", lambda: {"avx2"})  # no FMA
        assert native.best_variant() == "generic"


def test_a_variant_has_the_kernels_of_its_instruction_set(module):
    variant = module.variant()
    assert module.panels_supported() == (variant != "generic")
    assert module.tile_prefetch_supported() == (variant in PREFETCH_MODES)
    kind = module.bfloat16_panel_products()
    assert kind == BFLOAT16_PANELS[variant] or (variant == "amx" and kind == "dot")  # the kernel may refuse AMX
    assert (module.fma_rate(1000) > 0) == (variant != "generic")
    assert (module.dot_rate(1000) > 0) == (variant in ("avx512bf16", "amx"))
    if variant == "generic":
        with pytest.raises(RuntimeError, match="the panel kernel needs AVX-512F or AVX2 with FMA"):
            module.pack_panels(torch.randn(16, 8))


@pytest.mark.skipif(not VECTOR, reason="this CPU executes no variant with the panel kernel")
@pytest.mark.parametrize("out_features,in_features", [(16, 7), (48, 576), (96, 100), (32, 1536)])
def test_float32_panel_products_are_torchs_and_the_same_bits_in_every_variant(out_features, in_features):
    torch.manual_seed(out_features + in_features)
    weight, bias, x = torch.randn(out_features, in_features), torch.randn(out_features), torch.randn(70, in_features)
    reference = F.linear(x.double(), weight.double(), bias.double()).float()
    products = {}
    for variant in VECTOR:
        module = native.load(variant)
        panels = module.pack_panels(weight)
        modes = (0, 5, 10, 9) if module.tile_prefetch_supported() else (0,)  # native/panels.h: TilePrefetch
        y = module.panel_linear(x, panels, bias)
        torch.testing.assert_close(y, reference, rtol=1e-4, atol=1e-4)
        for rows in (1, 2, 3, 5, 8, 9, 16, 17):  # every tile shape: a row's bits never depend on its neighbours
            for mode in modes:
                assert torch.equal(module.panel_linear(x[:rows], panels, bias, mode), y[:rows]), (variant, rows, mode)
        products[variant] = y
    assert all(torch.equal(products[VECTOR[0]], y) for y in products.values())


def _restore_amx():
    for variant in ("avx512bf16", "amx"):
        if native.runnable(variant) and native.load(variant) is not None:
            native.load(variant).use_amx(True)


@pytest.mark.parametrize("out_features,in_features", [(16, 7), (48, 576), (96, 1152)])
def test_bfloat16_panel_products_as_each_variant_multiplies_them(module, out_features, in_features):
    torch.manual_seed(in_features)
    weight, bias = torch.randn(out_features, in_features).bfloat16(), torch.randn(out_features)
    kind = module.bfloat16_panel_products()
    if not kind:  # oneDNN multiplies bfloat16 there
        if module.panels_supported():
            with pytest.raises(RuntimeError, match="bfloat16 panels need the AVX2 build or AVX512-BF16"):
                module.pack_panels(weight)
        return
    panels, x = module.pack_panels(weight), torch.randn(40, in_features) * 3
    y = module.panel_linear(x, panels, bias)
    if kind == "widened":  # the float32 panels' bits for the widened weights
        assert torch.equal(y, module.panel_linear(x, module.pack_panels(weight.float()), bias))
        torch.testing.assert_close(
            y, F.linear(x.double(), weight.double(), bias.double()).float(), rtol=1e-4, atol=1e-4
        )
    else:  # dot, amx: the activations rounded to bfloat16, each product exact, sums in float32
        reference = F.linear(x.bfloat16().double(), weight.double(), bias.double()).float()
        torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-6 * in_features)
    for rows in (1, 2, 9, 16, 17, 33):
        assert torch.equal(module.panel_linear(x[:rows], panels, bias), y[:rows]), rows
    if kind == "amx" and native.runnable("avx512bf16"):  # without the tiles: the avx512bf16 variant's dot products
        try:
            module.use_amx(False)
            dot = native.load("avx512bf16")
            assert torch.equal(module.panel_linear(x, panels, bias), dot.panel_linear(x, dot.pack_panels(weight), bias))
        finally:
            _restore_amx()


def _target(variant: str, name: str, *overrides: str):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    cfg = validate(compose([f"model={name}", "logger=none", "hardware.fast_path=packed", *overrides]))
    before = os.environ.get(native.ENV_VARIANT)
    os.environ[native.ENV_VARIANT] = variant  # the backend's products and layer loop on this variant
    try:
        return load_model(cfg.model, cfg.hardware, progress=False).target
    finally:
        if before is None:
            os.environ.pop(native.ENV_VARIANT)
        else:
            os.environ[native.ENV_VARIANT] = before


def _session(target) -> list:
    """A prefill, a tree verification with a branch kept, then a one-token decode step: their logits."""
    target.reset(16)  # too small on purpose: the native loop grows the cache as the Python loop does
    prefill = target.prefill(list(range(30, 70)))
    tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]))
    verify = target.verify(tree, topology(tree.parents, target.cache_len))
    target.commit(40, [0, 2, 4])
    root = DraftTree.root_only(21)
    decode = target.verify(root, topology(root.parents, target.cache_len))
    return [prefill.logits, verify.logits, decode.logits]


@functools.cache
def _python_loop(name: str, head_dim: int | None, cache: str) -> list:
    sizes = [f"model.arch_config.head_dim={head_dim}"] if head_dim else []
    return _session(_target("generic", name, "hardware.native=off", f"hardware.cache_dtype={cache}", *sizes))


# tiny_qwen3 with head_dim 64: Qwen3's q/k norm and a few-row attention of several vectors a head; a bfloat16 cache
# (rows rounded where the native loop and the Python loop each write them: a key may differ by one last bit)
@pytest.mark.parametrize("cache", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", RUNNABLE)
def test_the_layer_loop_of_each_variant_matches_the_python_loop_and_decodes_as_it_verifies(variant, cache):
    products = "panel" if variant in VECTOR else "onednn"
    target = _target(variant, "tiny_qwen3", "hardware.native=on", f"hardware.product_kernel={products}",
                     "model.arch_config.head_dim=64", f"hardware.cache_dtype={cache}")  # fmt: skip
    assert target.native is native.load(variant) and variant in target.kernels["native_reason"]
    close = 1e-5 if cache == "float32" else 1e-3
    for got, expected in zip(_session(target), _python_loop("tiny_qwen3", 64, cache), strict=True):
        torch.testing.assert_close(got, expected, rtol=close, atol=close)
    assert target.cache.layers[0].keys.dtype == getattr(torch, cache)
    if products != "panel":
        return  # oneDNN's sums depend on the row count: decode and verification agree up to float ties
    prompt = [30 + i % 40 for i in range(40)]
    tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14]), parents=torch.tensor([-1, 0, 0, 1, 3]))
    target.reset(128)
    target.prefill(prompt)
    verified = target.verify(tree, topology(tree.parents, target.cache_len)).logits
    for path in ([0, 1, 3, 4], [0, 2]):  # each root-to-leaf path, one token a step: the verification's bits
        target.reset(128)
        target.prefill(prompt)
        for node in path:
            root = DraftTree.root_only(int(tree.tokens[node]))
            committed = target.cache_len
            logits = target.verify(root, topology(root.parents, committed)).logits
            assert torch.equal(logits[0], verified[node]), f"node {node} of path {path}"
            target.commit(committed, [0])


def test_the_row_helpers_of_each_variant_are_torchs(module):
    g = torch.Generator().manual_seed(0)
    for rows, width, k in [(1, 49152, 1), (8, 49152, 8), (3, 17, 5), (2, 7, 7)]:
        x = torch.randn(rows, width, generator=g)
        values, indices, unordered = module.row_topk(x, k)
        expected = x.topk(k, dim=-1)
        assert not bool(unordered) and torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
        torch.testing.assert_close(module.row_logsumexp(x * 8), torch.logsumexp(x * 8, -1, keepdim=True))
    ties = torch.zeros(2, 37)
    ties[0, [3, 9, 20, 36]] = 2.0
    ties[1, [30, 35]] = 1.0
    assert module.row_topk(ties, 3)[1].tolist() == [[3, 9, 20], [30, 35, 0]]  # equal values in index order
    nan = torch.zeros(1, 50)
    nan[0, 33] = float("nan")
    assert bool(module.row_topk(nan, 1)[2])  # torch orders a NaN: the caller falls back to it
    x, weight = torch.randn(5, 100, generator=g) * 3, torch.rand(100, generator=g) + 0.5
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(module.rms_norm_rows(x, weight, 1e-6), expected, rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(3, 2 * 1017, generator=g) * 10
    gate, up = gate_up.double().chunk(2, dim=-1)
    torch.testing.assert_close(module.swiglu(gate_up), (F.silu(gate) * up).float(), rtol=2e-6, atol=1e-5)


def test_a_commit_moves_the_same_rows_in_each_variant_as_aten(module):
    g = torch.Generator().manual_seed(1)
    buffers = [torch.randn(1, 2, 20, 4, generator=g) for _ in range(3)]
    expected = [buffer.clone() for buffer in buffers]
    rows = torch.tensor([0, 2, 3, 6])
    module.move_rows(buffers, 5, rows)
    for buffer in expected:
        buffer[:, :, 5 : 5 + len(rows)] = buffer[:, :, 5 + rows]
    assert all(torch.equal(a, b) for a, b in zip(buffers, expected))
    with pytest.raises(RuntimeError, match="ascend"):
        module.move_rows(buffers[:1], 0, torch.tensor([0, 3, 2]))


@pytest.mark.parametrize("variant", RUNNABLE)
def test_a_prompt_chunk_after_a_prefix_attends_causally_in_each_variant(variant):
    """A batch's chunk after a cached prefix with no mask (causal over the cache) through each variant's segment
    attention, the generic build's SDPA included (whose is_causal aligns top-left): the chunk's last logits are
    the whole prompt's in the Python loop."""
    from graft.backends.slots import SlotCaches
    from graft.backends.target import Segment

    target = _target(variant, "tiny_llama", "hardware.native=on")
    slots, ids = SlotCaches(target, 2, 64, ops=target.ops), torch.arange(30, 70)
    target.forward_segments(slots, [Segment(0, 0, ids[:20], torch.arange(20), None)])
    newcomer = Segment(1, 0, ids[:5], torch.arange(5), None)
    chunk = target.forward_segments(slots, [Segment(0, 20, ids[20:], torch.arange(20, 40), None), newcomer])[0]
    whole = _session(_target("generic", "tiny_llama", "hardware.native=off"))[0]
    torch.testing.assert_close(chunk.logits[-1], whole[-1], rtol=1e-4, atol=1e-4)
