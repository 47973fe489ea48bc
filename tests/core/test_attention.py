"""Attention with compact masks (graft/layers.py): a tree verified against the committed prefix without an
[n, S] mask, and prompt chunks attended causally without a [chunk, prefix + chunk] one, equal the
full-mask attention; generations through either path produce the same tokens."""

import random

import pytest
import torch
import torch.nn.functional as F
from conftest import compose, make_drafter

from graft.layers import attention_lse, grouped_sdpa, math_attention_lse, split_attention
from graft.tree import topology

HEAD_DIM = 16
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def random_parents(n: int, seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    return torch.tensor([-1] + [rng.randrange(i) for i in range(1, n)])


def qkv(kv_heads: int, groups: int, n: int, total: int, dtype: torch.dtype, seed: int = 0):
    """Queries as transformers hands them over ([b, heads, n, d], a transposed view), keys/values as the
    cache does (the filled part of a larger buffer)."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(1, n, kv_heads * groups, HEAD_DIM, generator=gen).to(dtype).transpose(1, 2)
    buffers = torch.randn(2, 1, kv_heads, total + 13, HEAD_DIM, generator=gen).to(dtype)
    return query, buffers[0, :, :, :total], buffers[1, :, :, :total]


def reference(query, key, value, mask=None, is_causal=False) -> torch.Tensor:
    """[b, n, heads, d]: torch's SDPA with every key/value head repeated per query head and the full mask."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("nodes", [1, 5, 60])
@pytest.mark.parametrize("prefix", [0, 7, 300])
def test_a_tree_block_merged_with_the_unmasked_prefix_equals_the_full_mask(dtype, groups, nodes, prefix):
    topo = topology(random_parents(nodes, seed=nodes + prefix), cache_len=prefix)
    query, key, value = qkv(2, groups, nodes, prefix + nodes, dtype, seed=groups)
    block = topo.tree_mask(dtype)  # [1, 1, n, n]
    assert block.shape == (1, 1, nodes, nodes)
    out, _ = grouped_sdpa(None, query, key, value, block)
    expected = reference(query, key, value, topo.attention_mask(dtype))
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    full, _ = grouped_sdpa(None, query, key, value, topo.attention_mask(dtype))  # the [n, S] path still works
    torch.testing.assert_close(full, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 4])
def test_a_prompt_in_chunks_without_masks_equals_one_causal_attention(dtype, groups):
    total, chunk = 300, 64
    query, key, value = qkv(2, groups, total, total, dtype)
    expected = reference(query, key, value, is_causal=True)
    parts = []
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)  # the chunk sees the cache up to its own end, no mask
        parts.append(grouped_sdpa(None, query[:, :, lo:hi], key[:, :, :hi], value[:, :, :hi], None)[0])
    torch.testing.assert_close(torch.cat(parts, dim=1), expected, **TOLERANCE[dtype])


def test_is_causal_false_without_a_mask_sees_every_key():
    query, key, value = qkv(2, 4, 5, 40, torch.float32)
    out, _ = grouped_sdpa(None, query, key, value, None, is_causal=False)
    torch.testing.assert_close(out, reference(query, key, value), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_math_fallback_equals_the_fused_kernel(dtype):
    """The path for devices without a fused kernel that returns the log-sum-exp, chunked over the keys."""
    query, key, value = qkv(1, 3, 20, 20, dtype)
    query = query.contiguous()
    topo = topology(random_parents(20, seed=3), cache_len=0)
    for mask, causal in ((None, False), (None, True), (topo.tree_mask(dtype), False)):
        out, lse = math_attention_lse(query, key.repeat(1, 3, 1, 1), value.repeat(1, 3, 1, 1), mask, None, causal, 8)
        fused_out, fused_lse = attention_lse(
            query, key.repeat(1, 3, 1, 1), value.repeat(1, 3, 1, 1), mask, None, causal
        )
        assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (1, 3, 20)
        torch.testing.assert_close(out, fused_out, **TOLERANCE[dtype])
        torch.testing.assert_close(lse, fused_lse.float(), rtol=1e-4, atol=1e-4)


def test_the_split_holds_a_tree_block_tiled_per_group():
    query, key, value = qkv(2, 4, 6, 26, torch.float32)
    topo = topology(random_parents(6, seed=1), cache_len=20)
    tiled = topo.tree_mask().repeat(1, 1, 4, 1)  # [1, 1, groups * n, n], as a caller that tiles once passes it
    out = split_attention(query, key, value, tiled).transpose(1, 2)
    torch.testing.assert_close(out, reference(query, key, value, topo.attention_mask()), rtol=1e-5, atol=1e-5)


# --- through the transformers forward (hardware.attention=graft_sdpa) ------------------------------------


def load(name: str, chunk: int):
    from graft.config.experiment import validate
    from graft.load.models import load_model

    overrides = [f"model={name}", "logger=none", "hardware=cpu_plain", "hardware.attention=graft_sdpa"]
    cfg = validate(compose([*overrides, f"hardware.prefill_chunk={chunk}"]))
    loaded = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)
    return loaded


def test_the_forward_hands_the_attention_compact_masks(monkeypatch):
    """Later prompt chunks reach graft_sdpa with no mask, a verification with its tree's [n, n] block."""
    import graft.layers

    target = load("tiny_llama", chunk=8).target
    seen = []
    split = graft.layers.split_attention

    def spy(query, key, value, block_mask, scale=None):
        seen.append((query.shape[2], key.shape[2], None if block_mask is None else tuple(block_mask.shape)))
        return split(query, key, value, block_mask, scale)

    monkeypatch.setattr(graft.layers, "split_attention", spy)
    target.reset(64)
    target.prefill(list(range(20, 40)))  # chunks of 8, 8, 4
    assert seen[:: target.num_layers] == [(8, 16, None), (4, 20, None)]
    seen.clear()
    parents = random_parents(5, seed=0)
    from graft.tree import DraftTree

    tree = DraftTree(tokens=torch.tensor([7, 8, 9, 10, 11]), parents=parents)
    target.verify(tree, topology(parents, target.cache_len))
    assert seen == [(5, 25, (1, 1, 5, 5))] * target.num_layers


@pytest.mark.parametrize("method", ["ar", "eagle3", "graft"])
def test_compact_and_full_masks_generate_the_same_tokens(method):
    from graft.data.loading import BUILTIN
    from graft.decode import generate

    model = load("tiny_llama", chunk=16)  # prompts of a few dozen tokens: several chunks
    target = model.target
    assert target.compact_masks
    ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[0].turns[0]}])
    assert len(ids) > 32
    tokens = {}
    for full in (True, False):
        target.full_masks = full
        drafter = make_drafter(method, target)
        tokens[full] = generate(target, drafter, ids, 40, model.stop_ids).new_tokens
    assert tokens[False] == tokens[True]
    assert len(tokens[False]) > 0


@pytest.mark.parametrize("groups", [1, 4])
def test_the_split_through_the_math_fallback_equals_the_full_mask(monkeypatch, groups):
    """What a device without a fused kernel that returns the log-sum-exp runs: small key chunks, some of
    them wholly hidden from a causal query row."""
    import functools

    import graft.layers

    monkeypatch.setattr(graft.layers, "attention_lse", functools.partial(math_attention_lse, chunk=8))
    query, key, value = qkv(2, groups, 20, 50, torch.float32)
    topo = topology(random_parents(20, seed=5), cache_len=30)
    out = split_attention(query, key, value, topo.tree_mask()).transpose(1, 2)
    torch.testing.assert_close(out, reference(query, key, value, topo.attention_mask()), rtol=1e-5, atol=1e-5)
    causal = split_attention(query, key, value, None).transpose(1, 2)
    full = torch.ones(20, 50, dtype=torch.bool).tril(diagonal=30)  # the prefix whole, the block causal
    expected = reference(query, key, value, torch.zeros(20, 50).masked_fill(~full, float("-inf")))
    torch.testing.assert_close(causal, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 4])
def test_on_cuda_the_split_uses_a_fused_kernel_and_equals_the_full_mask(dtype, groups):
    """CUDA's flash (half precision) or memory-efficient kernel returns the prefix part's log-sum-exp."""
    import graft.layers

    query, key, value = (t.cuda() for t in qkv(2, groups, 60, 360, dtype))
    topo = topology(random_parents(60, seed=9).cuda(), cache_len=300)
    out, _ = grouped_sdpa(None, query, key, value, topo.tree_mask(dtype))
    torch.testing.assert_close(out, reference(query, key, value, topo.attention_mask(dtype)), **TOLERANCE[dtype])
    chunk, _ = grouped_sdpa(None, query, key, value, None)  # the last 60 positions as a prompt chunk
    full = torch.ones(60, 360, dtype=torch.bool, device="cuda").tril(diagonal=300)
    torch.testing.assert_close(chunk, reference(query, key, value, full), **TOLERANCE[dtype])
    assert graft.layers._cuda_attention_lse(query.reshape(1, 2, -1, HEAD_DIM), key, value, None, False) is not None
