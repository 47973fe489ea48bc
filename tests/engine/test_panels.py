"""graft/cpu/native's panel kernel and few-row attention: the products and the attention against torch's, and
the load-time choice of which rows the panels serve (graft/cpu/products.py choose_product_kernel)."""

import os
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graft.cpu.native import build as native
from graft.cpu.products import (
    PANEL_TIE,
    PRODUCT_ROWS,
    TILE_PREFETCH,
    PackedLinear,
    choose_product_kernel,
    panel_rows_from,
    tile_prefetch_code,
)
from graft.schema import ConfigError

needs_panels = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None or native.load() is None or not native.load().panels_supported(),
    reason="no C++ compiler, or neither AVX-512F nor AVX2 + FMA: graft/cpu/native's panel kernel is not built here",
)


def _target(name: str, *overrides: str):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    cfg = validate(compose([f"model={name}", "logger=none", "hardware.fast_path=packed", *overrides]))
    return load_model(cfg.model, cfg.hardware, progress=False).target


@needs_panels
def test_the_panel_kernel_on_literal_arrays():
    module = native.load()
    weight = torch.arange(16 * 3, dtype=torch.float32).view(16, 3)  # row j: [3j, 3j + 1, 3j + 2]
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, -1.0]])
    y = module.panel_linear(x, module.pack_panels(weight), torch.full((16,), 0.5))
    expected = torch.stack([torch.arange(16) * 3.0 + 0.5, torch.full((16,), -0.5)])  # [2, 16]
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@needs_panels
@pytest.mark.parametrize("out_features", [16, 32, 48, 80, 96, 960])
@pytest.mark.parametrize("in_features", [7, 64, 576])
def test_the_panel_kernel_computes_the_linear_for_every_row_count(out_features, in_features):
    module = native.load()
    torch.manual_seed(out_features + in_features)
    weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
    panels = module.pack_panels(weight)
    assert panels.shape[0] * panels.shape[2] == out_features and panels.shape[1] == in_features
    for rows in (1, 2, 3, 5, 6, 7, 8, 9, 16, 17, 64, 70):
        x = torch.randn(rows, in_features)
        reference = F.linear(x.double(), weight.double(), bias.double()).float()
        torch.testing.assert_close(module.panel_linear(x, panels, bias), reference, rtol=1e-4, atol=1e-4)
        no_bias = F.linear(x.double(), weight.double()).float()
        torch.testing.assert_close(module.panel_linear(x, panels, torch.empty(0)), no_bias, rtol=1e-4, atol=1e-4)


@needs_panels
@pytest.mark.parametrize("out_features", [48, 96, 960])
def test_a_row_has_the_same_product_bits_whatever_the_row_count(out_features):
    """Rows go through different tiles by count (in AVX2, 24-column halves from 3 to 8 rows, 2-row tiles beyond);
    every accumulator still adds its k terms in order, so a row's product never depends on its neighbours."""
    module = native.load()
    torch.manual_seed(out_features)
    panels = module.pack_panels(torch.randn(out_features, 576))
    x = torch.randn(20, 576)
    every_row = module.panel_linear(x, panels, torch.empty(0))
    for rows in range(1, 20):
        assert torch.equal(module.panel_linear(x[:rows], panels, torch.empty(0)), every_row[:rows]), rows


@needs_panels
def test_the_panels_refuse_what_they_cannot_lay_out():
    module = native.load()
    with pytest.raises(RuntimeError, match="out_features divisible by 16, not 20"):
        module.pack_panels(torch.randn(20, 8))
    with pytest.raises(RuntimeError, match=r"weight: \[out, in\] float32.*not Half"):
        module.pack_panels(torch.randn(16, 8, dtype=torch.float16))
    if not module.bfloat16_panels_supported():  # AVX-512F without BF16: oneDNN multiplies bfloat16 there
        with pytest.raises(RuntimeError, match="bfloat16 panels need the AVX2 build or AVX512-BF16"):
            module.pack_panels(torch.randn(16, 8, dtype=torch.bfloat16))
    linear = PackedLinear(nn.Linear(8, 20), native_module=module)  # not divisible by 16: oneDNN only
    assert linear.panels is None and linear.onednn is not None


needs_bfloat16_panels = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None
    or native.load() is None
    or not native.load().bfloat16_panels_supported(),
    reason="bfloat16 panels are the AVX2 and AVX512-BF16 builds' (elsewhere bfloat16 goes through oneDNN)",
)


@pytest.fixture(autouse=True)
def _amx_restored():
    """A test may turn the AMX tiles off (the dot products on an AMX CPU); every test starts with them wanted."""
    yield
    module = native.loaded()
    if module is not None and hasattr(module, "use_amx"):
        module.use_amx(True)


def _bfloat16_panels(kind: str):
    """The native module where its bfloat16 panels multiply as `kind` says (widened, dot, amx), else a skip. On an
    AMX CPU the dot products are the ones left with the tiles off."""
    module = native.load()
    if kind == "dot" and module.bfloat16_panel_products() == "amx":
        module.use_amx(False)
    if module.bfloat16_panel_products() != kind:
        pytest.skip(f"this build's bfloat16 panels are {module.bfloat16_panel_products()!r}, not {kind!r}")
    return module


@needs_bfloat16_panels
@pytest.mark.parametrize("out_features,in_features", [(16, 7), (32, 64), (48, 576), (96, 100)])
def test_bfloat16_panels_give_the_float32_panels_bits_for_the_widened_weights(out_features, in_features):
    """Widening in the registers loses nothing: a bfloat16 weight is the high half of the float32 of the same
    value, and each accumulator adds its terms in the same order."""
    module = _bfloat16_panels("widened")
    torch.manual_seed(out_features)
    weight, bias = torch.randn(out_features, in_features).bfloat16(), torch.randn(out_features)
    narrow, wide = module.pack_panels(weight), module.pack_panels(weight.float())
    assert narrow.dtype == torch.bfloat16 and narrow.shape == wide.shape
    for rows in (1, 2, 3, 5, 6, 9, 16, 17, 70):
        x = torch.randn(rows, in_features)
        y = module.panel_linear(x, narrow, bias)
        assert torch.equal(y, module.panel_linear(x, wide, bias))
        reference = F.linear(x.double(), weight.double(), bias.double()).float()
        torch.testing.assert_close(y, reference, rtol=1e-4, atol=1e-4)


@needs_bfloat16_panels
@pytest.mark.parametrize("out_features,in_features", [(16, 7), (32, 64), (48, 576), (96, 1152), (48, 1537)])
def test_dot_bfloat16_panels_multiply_the_activations_rounded_to_bfloat16(out_features, in_features):
    """AVX512-BF16: the activations are rounded to bfloat16 (to nearest even) and each pair of products is exact
    in float32, so the result is the float64 product of the rounded activations up to float32 accumulation;
    unrounded activations would miss it by about 2^-9 of a term. Odd K is padded with a zero weight. A row's
    bits never depend on the rows beside it (decode and verification alike)."""
    module = _bfloat16_panels("dot")
    torch.manual_seed(in_features)
    weight, bias = torch.randn(out_features, in_features).bfloat16(), torch.randn(out_features)
    panels = module.pack_panels(weight)
    assert panels.dtype == torch.bfloat16 and panels.dim() == 3 and panels.shape[1] == in_features + in_features % 2
    for rows in (1, 2, 3, 8, 9, 16, 17, 70):
        x = torch.randn(rows, in_features) * 3
        y = module.panel_linear(x, panels, bias)
        reference = F.linear(x.bfloat16().double(), weight.double(), bias.double()).float()
        torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-6 * in_features)
        unrounded = F.linear(x.double(), weight.double(), bias.double()).float()
        assert (y - unrounded).abs().max() > 1e-3  # the test tells rounded from unrounded activations
    x = torch.randn(70, in_features)
    every_row = module.panel_linear(x, panels, bias)
    for rows in range(1, 20):
        assert torch.equal(module.panel_linear(x[:rows], panels, bias), every_row[:rows]), rows


@needs_bfloat16_panels
@pytest.mark.parametrize("out_features,in_features", [(16, 32), (32, 64), (48, 576), (96, 1152), (960, 576)])
def test_amx_panels_multiply_the_activations_rounded_to_bfloat16(out_features, in_features):
    """AMX (tdpbf16ps on the dot panels' layout): the float64 product of the rounded activations up to float32
    accumulation, for every row count (one tile group up to 16 rows, zero-padded groups of 16 two at a time
    beyond); a row's bits never depend on the rows beside it, so a decode step and a verification agree."""
    module = _bfloat16_panels("amx")
    torch.manual_seed(in_features)
    weight, bias = torch.randn(out_features, in_features).bfloat16(), torch.randn(out_features)
    panels = module.pack_panels(weight)
    for rows in (1, 2, 15, 16, 17, 31, 32, 33, 64, 70):
        x = torch.randn(rows, in_features) * 3
        y = module.panel_linear(x, panels, bias)
        assert y.shape == (rows, out_features) and y.is_contiguous()
        reference = F.linear(x.bfloat16().double(), weight.double(), bias.double()).float()
        torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-6 * in_features)
    x = torch.randn(70, in_features)
    every_row = module.panel_linear(x, panels, bias)
    for rows in range(1, 70, 3):
        assert torch.equal(module.panel_linear(x[:rows], panels, bias), every_row[:rows]), rows
    module.use_amx(False)  # the dot products sum in another order: the test tells the two kernels apart
    assert module.bfloat16_panel_products() == "dot"
    assert not torch.equal(module.panel_linear(x, panels, bias), every_row)


@needs_bfloat16_panels
def test_amx_panels_leave_a_k_that_is_no_multiple_of_32_to_the_dot_products():
    module = _bfloat16_panels("amx")
    torch.manual_seed(9)
    weight = torch.randn(48, 40).bfloat16()
    panels, x, none = module.pack_panels(weight), torch.randn(5, 40), torch.empty(0)
    with_tiles = module.panel_linear(x, panels, none)
    module.use_amx(False)
    assert torch.equal(with_tiles, module.panel_linear(x, panels, none))


def test_packed_bf16_runs_the_native_loop_on_bfloat16_products():
    """fast_path=packed_bf16: the products' weights in bfloat16, everything between them float32, so the C++
    layer loop runs where it builds (the full bf16 path runs the Python loop)."""
    from graft.cpu.products import Bf16PackedLinear

    target = _target("tiny_llama", "hardware.fast_path=packed_bf16")
    linears = target.lean.linears()
    assert all(isinstance(linear, Bf16PackedLinear) for linear in linears)
    assert target.lean.final_norm.dtype == torch.float32
    if native.load() is not None:
        assert target.kernels["native"] == "on", target.kernels
    if native.load() is not None and native.load().bfloat16_panels_supported():
        assert all(linear.narrow_panels and linear.packed.dtype == torch.bfloat16 for linear in linears)
        # a bfloat16 draft head's products, settled with the target's, go to the bfloat16 panels too (not oneDNN)
        head_product = target.ops.product(nn.Linear(64, 96).bfloat16())
        assert head_product.narrow_panels and head_product.onednn is None, target.kernels


@needs_bfloat16_panels
def test_bfloat16_weights_go_to_the_bfloat16_panels_where_the_build_has_them():
    """Even where oneDNN multiplies bfloat16 (an AVX-512 CPU), the build's bfloat16 panels take the weights."""
    module = native.load()
    torch.manual_seed(4)
    linear = PackedLinear(nn.Linear(64, 96).bfloat16(), native_module=module)
    assert linear.narrow_panels and linear.onednn is None and linear.packed.dtype == torch.bfloat16
    forced = PackedLinear(nn.Linear(64, 96).bfloat16(), products={"products": "onednn"}, native_module=module)
    assert not forced.narrow_panels and forced.panels is None


@needs_bfloat16_panels
def test_bfloat16_weights_oneDNN_cannot_multiply_go_to_the_bfloat16_panels(monkeypatch):
    import graft.cpu.products

    monkeypatch.setattr(graft.cpu.products, "onednn_packs", lambda dtype: dtype == torch.float32)
    module = native.load()
    torch.manual_seed(5)
    linear = nn.Linear(40, 48).bfloat16()
    narrow = PackedLinear(linear, native_module=module)
    assert narrow.narrow_panels and narrow.widened_from is None
    assert narrow.packed.dtype == torch.bfloat16 and narrow.packed.dim() == 3 and narrow.onednn is None
    widened = PackedLinear(linear)  # no native module: float32 copies
    assert widened.widened_from == torch.bfloat16 and not widened.narrow_panels
    forced = PackedLinear(linear, products={"products": "onednn"}, native_module=module)
    assert forced.widened_from == torch.bfloat16 and not forced.narrow_panels
    for rows in (1, 4, 13):
        x = torch.randn(rows, 40).bfloat16()
        with torch.no_grad():
            y = narrow(x)
            assert y.dtype == torch.bfloat16
            torch.testing.assert_close(y, widened(x))
    assert graft.cpu.products.widened_record([narrow, widened]) == {
        "widened": "bfloat16 weights held in float32: oneDNN has no bfloat16 products on this CPU",
        "narrow_panels": graft.cpu.products.NARROW_PANELS[module.bfloat16_panel_products()],
    }


@needs_panels
def test_a_mixed_product_reads_the_panels_up_to_its_rows_and_onednn_above():
    module = native.load()
    torch.manual_seed(0)
    linear = nn.Linear(40, 32)
    mixed = PackedLinear(
        linear, one_row="packed", products={"products": "mixed", "panel_rows": 4}, native_module=module
    )
    assert mixed.small is mixed.panels and mixed.small.dim() == 3 and mixed.packed is mixed.onednn
    assert mixed.single_row_t is None and mixed.small_rows == 4
    only = PackedLinear(linear, products={"products": "panel"}, native_module=module)
    assert only.packed.dim() == 3 and only.onednn is None and only.small is None
    for rows in (1, 4, 5, 20):
        x = torch.randn(rows, 40)
        with torch.no_grad():
            torch.testing.assert_close(mixed(x), linear(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(only(x), linear(x), rtol=1e-5, atol=1e-5)


def _load_times(panel, onednn):
    """choose_product_kernel's load-time medians, ms, from the panels' and oneDNN's per PRODUCT_ROWS count."""
    return {
        **{f"panel@{r}": t for r, t in zip(PRODUCT_ROWS, panel)},
        **{f"onednn@{r}": t for r, t in zip(PRODUCT_ROWS, onednn)},
    }


def test_the_panels_keep_the_row_counts_they_win_in_all_and_a_tie_does_not_cut_them_short():
    # the load-time times of a run where a 0.4% loss at 4 rows had cut the panels at 2 rows
    assert (
        panel_rows_from(
            _load_times([13.18, 14.06, 15.96, 14.34, 18.64, 30, 50], [17.45, 17.95, 15.89, 18.34, 20.19, 40, 60])
        )
        == 64
    )
    assert (
        panel_rows_from(_load_times([10, 10, 10, 20, 30, 40, 50], [12, 12, 12, 15, 20, 60, 70])) == 4
    )  # 33% slower at 8: stop
    assert (
        panel_rows_from(_load_times([13, 12, 12, 12, 12, 12, 12], [12, 12, 12, 12, 12, 12, 12])) == 0
    )  # 8% slower at 1 row
    assert (
        panel_rows_from(_load_times([12.2, 11, 11, 11, 11, 13, 13], [12, 12, 12, 12, 12, 12, 12])) == 16
    )  # a tie at 1 row, won up to 16, 8% slower at 32


def test_where_w_t_keeps_one_row_the_panels_are_judged_from_two_rows():
    # the AMX Xeon's load-time times: 8% slower than W_t at one row, 15-35% faster at 2-64
    measured = _load_times(
        [24.38, 22.32, 25.74, 28.82, 34.65, 48.41, 75.66], [22.53, 28.98, 29.78, 33.63, 40.69, 54.85, 87.48]
    )
    assert panel_rows_from(measured) == 0
    assert panel_rows_from(measured, first=2) == 64
    assert panel_rows_from(_load_times([9, 13, 12, 12, 12, 12, 12], [12, 12, 12, 12, 12, 12, 12]), first=2) == 0


@needs_panels
def test_one_row_reads_w_t_beside_the_panels_and_more_rows_the_panels():
    module = native.load()
    torch.manual_seed(0)
    linear = nn.Linear(40, 32)
    mixed = PackedLinear(linear, products={"products": "mixed", "panel_rows": 4}, native_module=module)
    w_t = linear.weight.detach().t().contiguous()
    mixed.one_row = w_t
    assert mixed.one_row is w_t and mixed.small is mixed.panels
    with torch.no_grad():
        x = torch.randn(1, 40)
        assert torch.equal(mixed(x), x @ w_t + linear.bias)  # W_t's bits, not the panels'
        for rows in (2, 4, 5):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(mixed(x), linear(x), rtol=1e-5, atol=1e-5)
        x = torch.randn(3, 40)
        assert torch.equal(mixed(x), module.panel_linear(x, mixed.panels, mixed.bias))


@needs_panels
def test_the_choice_measures_every_row_count_and_keeps_a_prefix():
    module = native.load()
    torch.manual_seed(0)
    linears = [PackedLinear(nn.Linear(64, 48), native_module=module) for _ in range(3)]
    record = choose_product_kernel(linears, "auto", repeats=1)
    assert record["products_reason"] == "measured at load"
    assert set(record["products_ms"]) == {f"{k}@{rows}" for k in ("panel", "onednn") for rows in PRODUCT_ROWS}
    if record["products"] == "mixed":
        rows, beside = record["panel_rows"], record["one_row_beside_panels"]
        assert rows in PRODUCT_ROWS and rows == panel_rows_from(record["products_ms"], first=2 if beside else 1)
        assert all(p.small is p.panels and p.small_rows == rows for p in linears)
        assert all((p.one_row is not None) == beside for p in linears)
        times = record["products_ms"]
        assert beside == (times["panel@1"] > PANEL_TIE * times["onednn@1"])  # W_t only beyond a tie
    else:
        assert record["products"] == "onednn" and all(p.panels is None for p in linears)


needs_prefetch_modes = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None
    or native.load() is None
    or not native.load().tile_prefetch_supported(),
    reason="tile prefetch modes are the AVX-512F builds' (the AVX2 tiles have one scheme)",
)


@needs_prefetch_modes
@pytest.mark.parametrize("out_features,in_features", [(48, 576), (32, 1536), (80, 100)])
def test_the_tile_prefetch_modes_give_the_same_bits(out_features, in_features):
    module = native.load()
    torch.manual_seed(out_features)
    panels, bias = module.pack_panels(torch.randn(out_features, in_features)), torch.randn(out_features)
    codes = [tile_prefetch_code(one, several) for one in TILE_PREFETCH for several in TILE_PREFETCH]
    assert sorted(codes) == [0, 1, 2, 4, 5, 6, 8, 9, 10]  # one tile's mode in bits 0-1, several tiles' in 2-3
    for rows in (1, 3, 8, 9, 16, 20, 64):  # each side of the one-tile boundary (8 rows)
        x = torch.randn(rows, in_features)
        results = [module.panel_linear(x, panels, bias, code) for code in codes]
        assert all(torch.equal(results[0], other) for other in results[1:]), rows
        assert torch.equal(results[0], module.panel_linear(x, panels, bias))  # the default: stream ahead for both
    for code in (3, 12, 16, -1):
        with pytest.raises(RuntimeError, match=r"tile prefetch: a mode 0 .*, 1 .* or 2 .* not "):
            module.panel_linear(torch.randn(2, in_features), panels, bias, code)


@needs_prefetch_modes
def test_each_product_passes_its_own_tile_prefetch_modes():
    """The modes are arguments, not the process's: products settled apart keep theirs, and a product made from a
    settled record (a draft head's) takes the record's."""
    module = native.load()
    torch.manual_seed(1)
    settled = {"products": "panel", "tile_prefetch": {"one_tile": "chunk_ahead", "several_tiles": "hardware"}}
    linear = nn.Linear(576, 96)
    chunked = PackedLinear(linear, products=settled, native_module=module)
    plain = PackedLinear(linear, products={"products": "panel"}, native_module=module)
    assert chunked.tile_prefetch == tile_prefetch_code("chunk_ahead", "hardware") == 9 and plain.tile_prefetch == 0
    for rows in (8, 9, 16):
        x = torch.randn(rows, 576)
        with torch.no_grad():
            assert torch.equal(chunked(x), plain(x)), rows


@needs_prefetch_modes
def test_the_product_choice_times_every_tile_prefetch_mode_per_tile_class_and_keeps_the_faster():
    module = native.load()
    torch.manual_seed(0)
    linears = [PackedLinear(nn.Linear(64, 48), native_module=module) for _ in range(3)]
    linears.append(PackedLinear(nn.Linear(64, 20), native_module=module))  # no panels: keeps the modes all the same
    record = choose_product_kernel(linears, "auto", repeats=1)
    chosen, times = record["tile_prefetch"], record["tile_prefetch_ms"]
    assert list(chosen) == list(times) == ["one_tile", "several_tiles"]
    for name in chosen:
        assert set(times[name]) == set(TILE_PREFETCH)
        assert times[name][chosen[name]] == min(times[name].values())  # rounded
    code = tile_prefetch_code(chosen["one_tile"], chosen["several_tiles"])
    assert all(linear.tile_prefetch == code for linear in linears)
    assert PackedLinear(nn.Linear(64, 48), products=record, native_module=module).tile_prefetch == code
    assert "tile_prefetch" not in choose_product_kernel(
        [PackedLinear(nn.Linear(64, 48), native_module=module)], "onednn"
    )


@needs_panels
def test_an_unknown_product_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match=r"hardware.product_kernel='mkl'; allowed: auto, panel, onednn"):
        choose_product_kernel([PackedLinear(nn.Linear(8, 16))], "mkl")


def test_panels_forced_without_the_native_build_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"hardware.product_kernel=panel, but hardware.native=off"):
        _target("tiny_llama", "hardware.native=off", "hardware.product_kernel=panel")
    target = _target("tiny_llama", "hardware.native=off")
    assert target.kernels["products"] == "onednn" and "hardware.native=off" in target.kernels["products_reason"]


@needs_panels
@pytest.mark.parametrize("product_kernel", ["panel", "onednn"])
def test_a_decode_step_matches_the_transformers_forward_with_either_product_kernel(product_kernel):
    from graft.tree import DraftTree, topology

    def decode_logits(target):
        target.reset(64)
        target.prefill(list(range(30, 60)))
        root = DraftTree.root_only(7)
        return target.verify(root, topology(root.parents, target.cache_len)).logits

    reference = decode_logits(_target("tiny_qwen3", "hardware.fast_path=none"))
    target = _target("tiny_qwen3", f"hardware.product_kernel={product_kernel}")
    assert target.kernels["products"] == product_kernel
    torch.testing.assert_close(decode_logits(target), reference, rtol=1e-4, atol=1e-4)


@needs_panels
@pytest.mark.parametrize(
    "name,head_dim,prompt_length",
    [("tiny_llama", None, 40), ("tiny_qwen3", None, 40), ("tiny_qwen3", 64, 40), ("tiny_qwen3", 64, 101)],
)
def test_a_token_has_the_same_logits_bits_in_a_verification_and_in_decode_steps(name, head_dim, prompt_length):
    """The native path with the panel kernel adds every row's terms in the same order whatever the row count
    and wherever masked keys sit, so greedy speculation is lossless exactly, not up to float ties. The attention
    pairs queries and reads values in blocks of keys: head_dim 64 and a prompt over several blocks cover that."""
    from graft.tree import DraftTree, topology

    sizes = [f"model.arch_config.head_dim={head_dim}"] if head_dim else []
    target = _target(name, "hardware.native=on", "hardware.product_kernel=panel", *sizes)
    prompt = [30 + i % 40 for i in range(prompt_length)]
    # root 7 with children 11 and 12; 11 -> 13 -> 14 a chain
    tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14]), parents=torch.tensor([-1, 0, 0, 1, 3]))
    target.reset(128)
    target.prefill(prompt)
    verified = target.verify(tree, topology(tree.parents, target.cache_len)).logits  # [5, vocab]
    for path in ([0, 1, 3, 4], [0, 2]):  # each root-to-leaf path, decoded one token per step
        target.reset(128)
        target.prefill(prompt)
        for node in path:
            root = DraftTree.root_only(int(tree.tokens[node]))
            committed = target.cache_len
            logits = target.verify(root, topology(root.parents, committed)).logits
            assert torch.equal(logits[0], verified[node]), f"node {node} of path {path}"
            target.commit(committed, [0])


def test_an_unknown_product_kernel_in_the_config_is_refused_with_the_allowed_ones():
    from conftest import compose

    from graft.config.experiment import validate

    with pytest.raises(
        ConfigError, match=r"hardware.product_kernel='mkl' is not allowed; allowed values: auto, panel, onednn"
    ):
        validate(compose(["model=tiny_llama", "logger=none", "hardware.product_kernel=mkl"]))


def test_panels_forced_where_no_product_has_them_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"hardware.product_kernel=panel, but no float32 products the panel kernel"):
        choose_product_kernel([PackedLinear(nn.Linear(8, 16))], "panel")
    with pytest.raises(ValueError, match=r"hardware.product_kernel=panel, but hardware.native=off"):
        choose_product_kernel([PackedLinear(nn.Linear(8, 16))], "panel", no_panels="hardware.native=off")
