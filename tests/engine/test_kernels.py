"""The product kernels of the fast CPU path: the one-row kernel chosen by measuring, and the draft head
running on the target's products, each against the plain computation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graft.cpu.products import PackedLinear, choose_one_row_kernel
from graft.tree import DraftTree, topology


def _packed(out_features: int, in_features: int, seed: int) -> tuple[nn.Linear, PackedLinear]:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=seed % 2 == 0)
    return linear, PackedLinear(linear)


@pytest.mark.parametrize("kernel", ["auto", "transposed", "packed"])
def test_every_one_row_kernel_computes_the_linear(kernel):
    pairs = [_packed(48, 32, 0), _packed(96, 48, 1), _packed(32, 96, 2)]
    record = choose_one_row_kernel([p for _, p in pairs], kernel, repeats=3)
    assert record["one_row"] in ("transposed", "packed")
    if kernel != "auto":
        assert record["one_row"] == kernel
    else:
        assert set(record["one_row_products_ms"]) == {"transposed", "packed"}
        best = min(record["one_row_products_ms"], key=record["one_row_products_ms"].get)
        assert record["one_row"] == best
    for linear, packed in pairs:
        assert (packed.single_row_t is None) == (record["one_row"] == "packed")  # the loser's copy is freed
        for rows in (1, 3):
            x = torch.randn(1, rows, linear.in_features)
            with torch.no_grad():
                torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_an_unknown_one_row_kernel_is_refused_by_name():
    _, packed = _packed(8, 8, 0)
    with pytest.raises(ValueError, match=r"hardware.one_row_kernel='gemv'; allowed: auto, transposed, packed"):
        choose_one_row_kernel([packed], "gemv")


@pytest.mark.parametrize("kernel", ["transposed", "packed"])
def test_a_decode_step_matches_the_transformers_forward_with_either_kernel(kernel):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    def decode_logits(overrides):
        cfg = validate(compose(["model=tiny_llama", "logger=none", *overrides]))
        loaded = load_model(cfg.model, cfg.hardware, progress=False)
        target = loaded.target
        target.reset(64)
        target.prefill(list(range(30, 60)))
        root = DraftTree.root_only(7)
        return target.verify(root, topology(root.parents, target.cache_len)).logits, target.kernels

    reference, _ = decode_logits(["hardware.fast_path=none"])
    logits, kernels = decode_logits(["hardware.fast_path=packed", f"hardware.one_row_kernel={kernel}"])
    assert kernels["one_row"] == kernel
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("product_kernel", ["onednn", "panel"])
def test_the_head_on_the_target_products_drafts_as_the_plain_head(product_kernel):
    """DraftHead.lean: q/k/v and gate/up fused, fc and the LM head packed (oneDNN's layout, or the panel
    kernel's where the native build has it); same outputs as the nn.Linear modules, and the state dict
    unchanged (training and saving read those)."""
    from conftest import compose

    from graft.config.experiment import validate
    from graft.cpu.native import build as native
    from graft.draft_models.eagle.checkpoint import random_head
    from graft.kv import KVBuffer
    from graft.load.models import load_model

    if product_kernel == "panel" and (native.load() is None or not native.load().panels_supported()):
        pytest.skip("no native build with the panel kernel (a C++ compiler and AVX-512F or AVX2 + FMA)")
    overrides = ["model=tiny_llama", "logger=none", "hardware.fast_path=packed"]
    cfg = validate(compose([*overrides, f"hardware.product_kernel={product_kernel}"]))
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    assert target.kernels["products"] == product_kernel
    plain = random_head(target, "eagle3", layer_ids=[0, 1, 2])
    lean = random_head(target, "eagle3", layer_ids=[0, 1, 2]).lean(target.ops)
    assert lean.state_dict().keys() == plain.state_dict().keys()
    assert lean.fast and lean.midlayer.self_attn.fast is not None and lean.midlayer.mlp.fast is not None
    assert (lean.fast["fc"].packed.dim() == 3) == (product_kernel == "panel")
    torch.manual_seed(3)
    hidden_size = target.config.hidden_size
    embeds, feats = torch.randn(5, hidden_size), torch.randn(5, 3 * hidden_size)
    outs = []
    for head in (plain, lean):
        cache = KVBuffer(16)
        first = head.step(embeds, feats, torch.arange(5), None, cache)  # the prompt: 5 rows
        second = head.step(embeds[:1], first[-1:], torch.tensor([5]), None, cache)  # one row: a level of one node
        outs.append((first, second, head.log_probs(second)[0]))
    for got, want in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _draft_head(obj, depth: int = 0):
    """The DraftHead somewhere inside a composed drafter."""
    from graft.draft_models.eagle.head import DraftHead

    if isinstance(obj, DraftHead):
        return obj
    if depth < 4 and hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            found = _draft_head(value, depth + 1)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("method", ["eagle3", "graft"])
def test_a_bfloat16_head_drafts_for_a_float32_target_losslessly(tiny, method):
    """method.head_dtype=bfloat16: the head's weights in bfloat16 (its activations and cache too on the
    Python path; float32 on the native one), the target in float32; the drafts differ in rounding only,
    and the target still decides every token."""
    from conftest import make_drafter

    from baselines.autoregressive import Autoregressive
    from graft.decode import generate

    target = tiny("tiny_llama:packed").target
    prompt = list(range(40, 64))
    base = generate(target, Autoregressive(target), prompt, 32, set())
    drafter = make_drafter(method, target, head_dtype="bfloat16", total_tokens=12)
    assert {p.dtype for p in _draft_head(drafter).parameters()} == {torch.bfloat16}
    out = generate(target, drafter, prompt, 32, set())
    assert out.new_tokens == base.new_tokens
    assert out.step_sources and all(drafted > 0 for drafted, *_ in out.step_sources)  # the bf16 head drafted


def test_head_dtype_auto_is_bfloat16_only_where_native_panels_hold_bfloat16():
    """method.head_dtype=auto is resolved by the backend's ops: the CPU engine's on a float32 target whose native
    layer loop holds bfloat16 panels; plain ops (the HF backend, GPUs) keep the target's dtype."""
    from types import SimpleNamespace

    from graft.cpu.ops import CpuOps
    from graft.methods.eagle3 import head_dtype_for
    from graft.ops import Ops

    def target(wide: bool = True, bf16_panels: bool | None = True):
        module = None if bf16_panels is None else SimpleNamespace(bfloat16_panels_supported=lambda: bf16_panels)
        return SimpleNamespace(ops=CpuOps(module, None, module, wide_target=wide))

    assert head_dtype_for("auto", target()) == "bfloat16"  # an AVX2 or AVX512-BF16 build
    assert head_dtype_for("auto", target(bf16_panels=False)) is None  # AVX-512F without BF16: oneDNN's bfloat16
    assert head_dtype_for("auto", target(bf16_panels=None)) is None  # no native build
    assert head_dtype_for("auto", target(wide=False)) is None  # a bfloat16 target: already the target's dtype
    assert head_dtype_for("auto", SimpleNamespace(ops=Ops())) is None  # not the CPU engine
    assert head_dtype_for("float32", target()) == "float32" and head_dtype_for(None, target()) is None


def test_the_block_drafter_on_the_target_products_drafts_as_the_plain_one():
    """BlockDrafter.lean (q, fused k/v, o, gate/up, down and fc on the target's products) and the target's
    packed LM head give the plain drafter's outputs; the state dict is unchanged."""
    from conftest import compose

    from graft.config.experiment import validate
    from graft.draft_models.dflash.checkpoint import random_block_drafter
    from graft.load.models import load_model

    cfg = validate(compose(["model=tiny_llama", "logger=none", "hardware.fast_path=packed"]))
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    plain = random_block_drafter(target, 0, num_layers=2, block_size=6)
    lean = random_block_drafter(target, 0, num_layers=2, block_size=6).lean(target.ops.product)
    assert lean.state_dict().keys() == plain.state_dict().keys() and lean.fast
    torch.manual_seed(5)
    features = torch.randn(9, plain.cfg.feature_size)
    embeds = torch.randn(6, plain.cfg.hidden_size)
    outs = []
    for model in (plain, lean):
        caches = model.new_caches(32)
        model.encode(features, caches)
        outs.append(model.block(embeds, caches))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        reference = target.model.lm_head(outs[0])
    torch.testing.assert_close(target.lm_head(outs[0]), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["transposed", "packed"])
def test_a_product_made_after_the_choice_keeps_only_the_chosen_copy(kernel):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    cfg = validate(compose(["model=tiny_llama", "logger=none", "hardware=cpu", f"hardware.one_row_kernel={kernel}"]))
    target = load_model(cfg.model, cfg.hardware, progress=False).target
    torch.manual_seed(0)
    linear = nn.Linear(40, 24)
    made = target.ops.product(linear)
    assert isinstance(made, PackedLinear) and (made.single_row_t is None) == (kernel == "packed")
    for rows in (1, 5):
        x = torch.randn(1, rows, 40)
        with torch.no_grad():
            torch.testing.assert_close(made(x), linear(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_weights_oneDNN_cannot_multiply_here_are_held_in_float32(monkeypatch, dtype):
    """On a CPU where oneDNN packs no bfloat16 (an AMD Zen 3: no avx512bw / avx_ne_convert) a bfloat16 head or
    target must still load and compute: the same weight values in float32, the caller's dtype in and out."""
    import graft.cpu.products

    monkeypatch.setattr(graft.cpu.products, "onednn_packs", lambda weight_dtype: weight_dtype == torch.float32)
    torch.manual_seed(3)
    linear = nn.Linear(32, 48).to(dtype)
    packed = PackedLinear(linear)
    assert packed.widened_from == dtype and packed.packed.dtype == torch.float32
    for rows in (1, 5):
        x = torch.randn(rows, 32).to(dtype)
        with torch.no_grad():
            y = packed(x)
            expected = (x.float() @ linear.weight.float().t() + linear.bias.float()).to(dtype)
        assert y.dtype == dtype
        torch.testing.assert_close(y, expected)  # within one rounding of the dtype: the sums may be ordered apart
    assert graft.cpu.products.widened_record([packed, PackedLinear(nn.Linear(8, 16))]) == {
        "widened": f"{str(dtype).removeprefix('torch.')} weights held in float32: oneDNN has no "
        f"{str(dtype).removeprefix('torch.')} products on this CPU"
    }
    assert graft.cpu.products.widened_record([PackedLinear(nn.Linear(8, 16))]) == {}
