"""The native layer loop (graft/cpu/native) against the Python loop it replaces: same logits, taps and cache."""

import os
import shutil

import pytest
import torch

from graft.backends.target import HiddenTap
from graft.cpu.native import build as native
from graft.cpu.ops import CpuOps
from graft.schema import ConfigError
from graft.tree import DraftTree, topology

# the build needs a C++ compiler; where there is none these tests skip (the fallback is tested without one)
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler to build graft/cpu/native"
)


def _target(name: str, *overrides: str):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    cfg = validate(compose([f"model={name}", "logger=none", "hardware.fast_path=packed", *overrides]))
    return load_model(cfg.model, cfg.hardware, progress=False).target


def _without_layer(target) -> CpuOps:
    """The target's ops with its products but no native head layer (the head's own modules run)."""
    return CpuOps(target.ops.module, target.ops.product, None, target.ops.wide_target)


def _session(target) -> dict:
    """A prefill, a tree verification with a branch kept, then a one-token decode step, all with taps."""
    taps = (HiddenTap(0, "input"), HiddenTap(1, "output"), HiddenTap(2, "input"))
    target.reset(16)  # too small on purpose: the native loop must grow the cache as the Python loop does
    prefill = target.prefill(list(range(30, 70)), taps)
    tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]))
    verify = target.verify(tree, topology(tree.parents, target.cache_len), taps)
    target.commit(40, [0, 2, 4])
    root = DraftTree.root_only(21)
    decode = target.verify(root, topology(root.parents, target.cache_len), taps)
    layers = target.cache.layers
    return {
        "logits": [prefill.logits, verify.logits, decode.logits],
        "hidden": [prefill.hidden, verify.hidden, decode.hidden],
        "keys": [layer.keys[:, :, : layer.length] for layer in layers],
        "values": [layer.values[:, :, : layer.length] for layer in layers],
        "length": target.cache_len,
    }


@needs_compiler
# head_dim: the native few-row attention's sizes (16 by the configs; 64 and 128 through Qwen3's explicit head_dim);
# products "panel": the panel kernel for every row count (an AVX-512F or AVX2 + FMA build)
@pytest.mark.parametrize(
    "name,one_row,products,head_dim",
    [
        ("tiny_llama", "transposed", "onednn", None),
        ("tiny_llama", "packed", "onednn", None),
        ("tiny_qwen3", "transposed", "onednn", None),
        ("tiny_qwen3", "packed", "onednn", None),
        ("tiny_llama", "packed", "panel", None),
        ("tiny_llama", "transposed", "panel", None),  # one row on W_t beside the panels (one_row in LAYER_FIELDS)
        ("tiny_qwen3", "packed", "panel", None),
        ("tiny_qwen3", "packed", "panel", 64),
        ("tiny_qwen3", "packed", "onednn", 128),
    ],
)
def test_the_native_loop_matches_the_python_loop(name, one_row, products, head_dim):
    if products == "panel" and not native.load().panels_supported():
        pytest.skip("this CPU has neither AVX-512F nor AVX2 with FMA: no panel kernel")
    sizes = [f"model.arch_config.head_dim={head_dim}"] if head_dim else []
    native_target = _target(
        name, "hardware.native=on", f"hardware.one_row_kernel={one_row}", f"hardware.product_kernel={products}", *sizes
    )
    python_target = _target(name, "hardware.native=off", f"hardware.one_row_kernel={one_row}", *sizes)
    assert native_target.kernels["native"] == "on" and python_target.kernels["native"] == "off"
    beside = [p.one_row is not None for p in native_target.lean.linears() if hasattr(p, "one_row")]
    assert any(beside) == (products == "panel" and one_row == "transposed")
    got, expected = _session(native_target), _session(python_target)
    assert got["length"] == expected["length"] == 44
    for key in ("logits", "hidden", "keys", "values"):
        for a, b in zip(got[key], expected[key], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("name,head_dim", [("tiny_llama", None), ("tiny_qwen3", 64)])
def test_a_bfloat16_cache_holds_bfloat16_rows_that_the_native_loop_reads_as_the_python_loop(name, head_dim):
    sizes = [f"model.arch_config.head_dim={head_dim}"] if head_dim else []
    narrow = "hardware.cache_dtype=bfloat16"
    got = _session(_target(name, "hardware.native=on", narrow, *sizes))
    expected = _session(_target(name, "hardware.native=off", narrow, *sizes))
    wide = _session(_target(name, "hardware.native=on", *sizes))
    assert {t.dtype for t in got["keys"] + got["values"] + expected["keys"]} == {torch.bfloat16}
    assert wide["keys"][0].dtype == torch.float32
    for key in ("keys", "values"):  # each loop rounds its own rotated float32 keys: one last bit may differ
        for a, b in zip(got[key], expected[key], strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=8e-3, atol=1e-3)
    for key in ("logits", "hidden"):
        for a, b in zip(got[key], expected[key], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    # negative control: the narrow cache is what the forward read (a float32 cache gives other logits)
    assert max((a - b).abs().max().item() for a, b in zip(got["logits"], wide["logits"])) > 2e-3


@needs_compiler
def test_native_on_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match=r"hardware.native=on, but it runs dense MLPs only"):
        _target("tiny_qwen3_moe", "hardware.native=on")
    with pytest.raises(ConfigError, match=r"hardware.native=on, but it runs float32 on the CPU"):
        _target("tiny_llama", "hardware.native=on", "hardware.fast_path=bf16")
    assert _target("tiny_qwen3_moe").kernels["native"] == "off"  # auto: the Python loop, and why


def test_an_unknown_native_mode_is_refused_by_name():
    target = _target("tiny_llama", "hardware.native=off")
    with pytest.raises(ValueError, match=r"hardware.native='fast'; allowed: auto, on, off"):
        target.lean.enable_native("fast")


def test_a_failed_build_falls_back_to_the_python_loop_and_says_why(monkeypatch):
    monkeypatch.setattr(native, "load", lambda verbose=False: None)
    monkeypatch.setattr(native, "failure", lambda: "CalledProcessError: no C++ compiler")
    target = _target("tiny_llama")
    assert target.kernels["native"] == "off"
    assert "no C++ compiler" in target.kernels["native_reason"]
    assert target.lean.native is None
    with pytest.raises(ConfigError, match="the native build failed"):
        _target("tiny_llama", "hardware.native=on")


def test_the_build_key_changes_with_the_sources_and_the_variant(monkeypatch, tmp_path):
    for path in [*native.SOURCE_DIR.glob("*.cpp"), *native.SOURCE_DIR.glob("*.h")]:
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(native, "SOURCE_DIR", tmp_path)
    before = {variant: native.build_key(variant) for variant in native.VARIANTS}
    assert len(set(before.values())) == len(native.VARIANTS)
    header = tmp_path / "panels.h"
    header.write_text(header.read_text() + "\n// edited\n")  # a header counts as much as a .cpp
    assert all(native.build_key(variant) != key for variant, key in before.items())


@needs_compiler
@pytest.mark.parametrize("kind", ["eagle3", "eagle1"])
def test_the_native_head_layer_matches_the_python_layer(kind):
    """An extend of 5 entries (causal over the head's cache), a draft level of 3 nodes under a tree mask,
    then one node that sees the whole cache: same outputs and cache through graft/cpu/native as through Python."""
    from graft.draft_models.eagle.checkpoint import random_head
    from graft.kv import KVBuffer
    from graft.methods.eagle_tree import head_step

    target = _target("tiny_llama", "hardware.native=on")
    hidden_size = target.config.hidden_size
    heads = []
    for ops in (_without_layer(target), target.ops):
        head = random_head(target, kind, layer_ids=[0, 1, 2] if kind == "eagle3" else None)
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():  # norms away from their initial ones, so a norm weight misplaced shows
            for p in head.parameters():
                if p.ndim == 1 and p.dtype == torch.float32:
                    p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
        heads.append(head.lean(ops))
    assert heads[0].engine is None and heads[1].engine is not None
    gen = torch.Generator().manual_seed(3)
    feature_size = 3 * hidden_size if kind == "eagle3" else hidden_size
    embeds, feats = torch.randn(5, hidden_size, generator=gen), torch.randn(5, feature_size, generator=gen)
    level = torch.tensor([[True] * 5 + [True, False, False], [True] * 5 + [False, True, False], [True] * 8])
    outs, caches = [], []
    with torch.inference_mode():
        for head in heads:
            cache = KVBuffer(4)  # grown by both paths
            first = head_step(head, cache, embeds, feats, torch.arange(5), None)
            nodes = head_step(head, cache, embeds[:3], first[-3:], torch.tensor([5, 5, 6]), level)
            last = head_step(head, cache, embeds[:1], nodes[-1:], torch.tensor([7]), None)
            outs.append((first, nodes, last))
            caches.append((cache.keys[:, :, : cache.length], cache.values[:, :, : cache.length], cache.length))
    for got, want in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert caches[1][2] == caches[0][2] == 9
    for got, want in zip(caches[1][:2], caches[0][:2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@needs_compiler
def test_a_bfloat16_head_on_the_native_path_keeps_float32_activations_and_cache():
    """A bfloat16 head's products read bfloat16 weights; its layer, cache and outputs stay float32, also for an
    extend longer than the target's native row limit (the whole prompt at once)."""
    from graft.draft_models.eagle.checkpoint import random_head
    from graft.kv import KVBuffer
    from graft.methods.eagle_tree import head_step

    target = _target("tiny_llama", "hardware.native=on")
    hidden_size = target.config.hidden_size
    reference = random_head(target, "eagle3", layer_ids=[0, 1, 2]).lean(target.ops)
    half = random_head(target, "eagle3", layer_ids=[0, 1, 2]).to(torch.bfloat16).lean(target.ops)
    assert half.engine is not None and half.fc.weight.dtype == torch.bfloat16
    gen = torch.Generator().manual_seed(4)
    embeds, feats = torch.randn(80, hidden_size, generator=gen), torch.randn(80, 3 * hidden_size, generator=gen)
    outs = []
    with torch.inference_mode():
        for head in (reference, half):
            cache = KVBuffer(16)
            first = head_step(head, cache, embeds, feats, torch.arange(80), None)
            last = head_step(head, cache, embeds[:1], first[-1:], torch.tensor([80]), None)
            logp, _ = head.log_probs(last)
            assert cache.keys.dtype == cache.values.dtype == first.dtype == last.dtype == torch.float32
            assert cache.length == 81
            outs.append((first, logp))
    for got, want in zip(outs[1], outs[0], strict=True):
        assert torch.isfinite(got).all()
        assert (got - want).norm() / want.norm() < 0.05  # rounding of weights and product inputs only


@pytest.mark.skipif(native.load() is None, reason="no native build here")
def test_the_native_swiglu_matches_torch_over_the_whole_range():
    gate = torch.tensor(
        [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 3.0, -3.0, 20.0, -20.0, 87.0, -87.0, 88.5, -88.5, 1e4, -1e4]
    )
    gate = torch.cat([gate, torch.linspace(-30, 30, 1001)])  # [1017]: vector lanes and a scalar tail
    up = torch.linspace(-2, 2, gate.shape[0])
    out = native.load().swiglu(torch.cat([gate, up])[None])  # [1, 1017]
    expected = (torch.nn.functional.silu(gate.double()) * up.double()).float()
    torch.testing.assert_close(out[0], expected, rtol=2e-6, atol=1e-30)


@pytest.mark.skipif(native.load() is None, reason="no native build here")
def test_the_native_row_top_k_orders_as_torch_and_breaks_ties_by_index():
    top_k_rows = CpuOps(native.load(), None, None, wide_target=True).top_k_rows
    g = torch.Generator().manual_seed(0)
    for rows, width, k in [(1, 49152, 1), (8, 49152, 8), (3, 17, 5), (5, 8192, 10), (2, 7, 7), (4, 9, 1)]:
        x = torch.randn(rows, width, generator=g)
        values, indices = top_k_rows(x, k)
        expected = x.topk(k, dim=-1)
        assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
        assert torch.equal(top_k_rows(x, 1)[1][:, 0], x.argmax(-1))
    # equal values: the lower index first, as torch.argmax's first maximum (ties in the vector part and the tail)
    x = torch.zeros(2, 37)
    x[0, [3, 9, 20, 36]] = 2.0
    x[1, [30, 35]] = 1.0
    values, indices = top_k_rows(x, 3)
    assert indices.tolist() == [[3, 9, 20], [30, 35, 0]] and values.tolist() == [[2, 2, 2], [1, 1, 0]]
    assert top_k_rows(x, 1)[1][:, 0].tolist() == x.argmax(-1).tolist() == [3, 30]
    ramp = torch.full((1, 40), float("-inf"))
    assert top_k_rows(ramp, 2)[1].tolist() == [[0, 1]]
    # a NaN: the row's order is torch's (argmax takes the NaN)
    x = torch.zeros(2, 50)
    x[1, 33] = float("nan")
    assert top_k_rows(x, 1)[1][:, 0].tolist() == x.argmax(-1).tolist() == [0, 33]


@pytest.mark.skipif(native.load() is None, reason="no native build here")
def test_a_commit_moves_the_same_rows_natively_as_through_aten():
    from graft.backends.positional_cache import PositionalKVCache

    g = torch.Generator().manual_seed(0)
    caches = []
    for _ in range(2):
        cache = PositionalKVCache(3, 20)
        for layer in cache.layers:
            layer.append(torch.randn(1, 2, 12, 4, generator=g), torch.randn(1, 2, 12, 4, generator=g))
        caches.append(cache)
    for a, b in zip(caches[0].layers, caches[1].layers):
        b.keys.copy_(a.keys), b.values.copy_(a.values)
    rows = torch.tensor([0, 2, 3, 6])
    assert native.loaded() is not None
    caches[0].keep(5, rows, 4)  # native: one call for every layer
    for layer in caches[1].layers:
        layer.keep(5, rows, 4)  # each layer through ATen's indexed copies
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert a.length == b.length == 9
        assert torch.equal(a.keys[:, :, :9], b.keys[:, :, :9]) and torch.equal(a.values[:, :, :9], b.values[:, :, :9])
    with pytest.raises(RuntimeError, match="ascend"):
        native.load().move_rows([caches[0].layers[0].keys], 0, torch.tensor([0, 3, 2]))


@pytest.mark.skipif(native.load() is None, reason="no native build here")
def test_the_native_row_logsumexp_matches_torch_with_infinities_and_nan():
    torch.manual_seed(2)
    for width in (8192, 37, 5):  # vector blocks and a scalar tail
        x = torch.randn(6, width) * 8
        x[1, ::3] = float("-inf")
        x[2] = float("-inf")  # every entry masked
        torch.testing.assert_close(native.load().row_logsumexp(x), torch.logsumexp(x, -1, keepdim=True))
        x[3, width // 2] = float("nan")
        x[4, 0] = float("inf")
        got = native.load().row_logsumexp(x)
        assert torch.isnan(got[3, 0]) and got[4, 0] == float("inf") and got[2, 0] == float("-inf")


@needs_compiler
def test_a_native_heads_top_log_probs_are_the_top_k_of_its_log_softmax():
    """top_log_probs skips writing the log-softmax out: the same tokens in the same order, the same
    log-probabilities up to float32 rounding, and the same as the Python head's."""
    from graft.draft_models.eagle.checkpoint import random_head

    target = _target("tiny_llama", "hardware.native=on")
    hidden_size = target.config.hidden_size
    fast = random_head(target, "eagle3", layer_ids=[0, 1, 2]).lean(target.ops)
    plain = random_head(target, "eagle3", layer_ids=[0, 1, 2])
    assert fast.engine is not None and plain.engine is None
    out = torch.randn(7, hidden_size, generator=torch.Generator().manual_seed(9)) * 3
    with torch.inference_mode():
        for head in (fast, plain):
            logp, _ = head.log_probs(out)
            want = torch.topk(logp, 5, dim=-1)
            values, indices, _ = head.top_log_probs(out, 5)
            assert torch.equal(indices, want.indices)
            torch.testing.assert_close(values, want.values, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_the_native_head_layer_tiles_an_untiled_mask_where_it_falls_back_to_sdpa():
    """The few-row attention reads a tree mask of n rows; SDPA's folded query axis needs it once a group of query
    heads, so the fallback (here forced by a mask that is not contiguous) tiles it: same outputs either way."""
    from graft.draft_models.eagle.checkpoint import random_head
    from graft.kv import KVBuffer
    from graft.methods.eagle_tree import head_step
    from graft.tree import additive_mask

    target = _target("tiny_llama", "hardware.native=on")
    head = random_head(target, "eagle3", layer_ids=[0, 1, 2]).lean(target.ops)
    assert head.cfg.num_heads > head.cfg.num_kv_heads  # grouped query heads: the case that needs the tiling
    hidden_size = target.config.hidden_size
    gen = torch.Generator().manual_seed(6)
    embeds, feats = torch.randn(5, hidden_size, generator=gen), torch.randn(5, 3 * hidden_size, generator=gen)
    allowed = torch.tensor([[True] * 5 + [True, False, False], [True] * 5 + [False, True, False], [True] * 8])
    dense = additive_mask(allowed, torch.float32)  # [1, 1, 3, 8]
    strided = dense.transpose(-1, -2).contiguous().transpose(-1, -2)  # the same values, not contiguous
    assert not strided.is_contiguous()
    outs = []
    with torch.inference_mode():
        for mask in (dense, strided):
            cache = KVBuffer(16)
            first = head_step(head, cache, embeds, feats, torch.arange(5), None)
            outs.append(head.engine.layer(embeds[:3], first[-3:], torch.tensor([5, 5, 6]), mask, cache))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def _prompt_in_chunks(target, ids: torch.Tensor, cuts: list[int]) -> tuple[torch.Tensor, list]:
    """`ids` encoded into slot 0 of a two-slot batch in chunks ending at `cuts`, each chunk's forward beside a
    one-token step of slot 1 (as a newcomer's prompt rides in a batch's decode steps). Returns the last chunk's
    logits and slot 0's cached keys."""
    from graft.backends.slots import SlotCaches
    from graft.backends.target import Segment

    slots = SlotCaches(target, 2, len(ids) + 8, ops=target.ops)
    target.forward_segments(slots, [Segment(1, 0, torch.tensor([5, 6, 7]), torch.arange(3), None)])
    lo, other = 0, 3
    for hi in cuts:
        prompt = Segment(0, lo, ids[lo:hi], torch.arange(lo, hi), None)
        beside = Segment(1, other, torch.tensor([9]), torch.tensor([other]), None)
        last = target.forward_segments(slots, [prompt, beside])[0]
        lo, other = hi, other + 1
    return last.logits[-1], [keys[0, :, : len(ids)] for keys in slots.keys]


@needs_compiler
def test_a_long_prompt_is_the_same_bits_whole_at_batch_1_and_in_chunks_beside_another_sequence():
    """A prompt longer than a verification (100 positions) through the native loop: whole at batch 1, or cut
    where a batch's per-step prefill budget cuts it (37 + 63, then 64 + 36) beside another sequence's decode
    token, its last logits and its cache are the same bits, so a batched run's newcomers decode as batch 1 does.
    Negative control: the Python loop for the chunks (the native loop's rule before) gives other bits."""
    if not native.load().panels_supported():
        pytest.skip("this CPU has neither AVX-512F nor AVX2 with FMA: no panel kernel")
    target = _target("tiny_llama", "hardware.native=on", "hardware.product_kernel=panel")
    ids = torch.arange(3, 103) % 200
    target.reset(108)
    whole = target.prefill(ids.tolist()).logits[-1]
    cached = [layer.keys[0, :, :100] for layer in target.cache.layers]
    for cuts in ([37, 100], [64, 100]):
        logits, keys = _prompt_in_chunks(target, ids, cuts)
        assert torch.equal(logits, whole)
        assert all(torch.equal(a, b) for a, b in zip(keys, cached, strict=True))
    native_module, target.lean.native = target.lean.native, None  # the chunks through the Python loop
    try:
        logits, keys = _prompt_in_chunks(target, ids, [37, 100])
    finally:
        target.lean.native = native_module
    torch.testing.assert_close(logits, whole, rtol=1e-4, atol=1e-4)
    assert not torch.equal(logits, whole) or not all(torch.equal(a, b) for a, b in zip(keys, cached, strict=True))
