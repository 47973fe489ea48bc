"""The target backends against plain Hugging Face forwards: hidden-state taps and cache compaction."""

import pytest
import torch

from graft.backends.target import HiddenTap
from graft.tree import DraftTree, topology


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3_moe"])
def test_hidden_taps_match_output_hidden_states(tiny, name):
    model = tiny(name)
    target = model.target
    taps = (HiddenTap(2, "input"), HiddenTap(1, "output"), HiddenTap(3, "input"))
    ids = list(range(40, 60))
    target.reset(64)
    pre = target.prefill(ids, taps)
    with torch.inference_mode():
        ref = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    # hidden_states[i] is the input of layer i; the output of layer i is the input of layer i + 1
    expected = torch.cat([ref[2][0], ref[2][0], ref[3][0]], dim=-1)
    assert pre.hidden.shape == (20, 3 * target.hidden_size)
    torch.testing.assert_close(pre.hidden, expected, rtol=1e-4, atol=1e-5)
    assert pre.logits.shape == (1, target.vocab_size)
    target.reset(64)
    assert target.prefill(ids).hidden is None  # taps are per call: a forward that asks for none computes none


def test_commit_of_a_branch_equals_encoding_it_directly(tiny):
    """Verify a tree, keep a non-contiguous path, and check the cache against a fresh prefill."""
    target = tiny("tiny_llama").target
    prompt = [5, 17, 99, 3, 42, 8]
    # root 7 -> {11, 12}; 11 -> {13}; 12 -> {14 -> 15}: keep 0, 2, 4, 5 (root, 12, 14, 15)
    tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]))
    target.reset(32)
    target.prefill(prompt)
    target.verify(tree, topology(tree.parents, target.cache_len))
    target.commit(len(prompt), [0, 2, 4, 5])
    assert target.cache_len == len(prompt) + 4

    probe = DraftTree.root_only(21)
    after_commit = target.verify(probe, topology(probe.parents, target.cache_len)).logits

    target.reset(32)
    direct = target.prefill(prompt + [7, 12, 14, 15, 21]).logits
    torch.testing.assert_close(after_commit, direct, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_moe"])
@pytest.mark.parametrize("fast_path", ["transposed", "packed", "packed_bf16", "bf16"])
def test_fast_paths_match_the_transformers_forward(name, fast_path):
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    def logits_and_taps(path, dtype="float32"):
        cfg = validate(compose([f"model={name}", "logger=none", f"hardware.fast_path={path}", f"model.dtype={dtype}"]))
        target = load_model(cfg.model, cfg.hardware, progress=False).target
        taps = (HiddenTap(1, "input"), HiddenTap(2, "output"))
        target.reset(64)
        pre = target.prefill(list(range(30, 70)), taps)
        tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]))
        out = target.verify(tree, topology(tree.parents, target.cache_len), taps)
        return pre, out

    # bf16 is compared with transformers' forward in bf16: same weights, same precision; packed_bf16 (products on
    # weights and activations rounded to bfloat16, the rest float32) with the float32 forward, at bf16's tolerance
    (ref_pre, ref) = logits_and_taps("none", "bfloat16" if fast_path == "bf16" else "float32")
    pre, out = logits_and_taps(fast_path)
    tol = dict(rtol=0.02, atol=0.05) if "bf16" in fast_path else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pre.logits, ref_pre.logits, **tol)
    torch.testing.assert_close(out.logits, ref.logits, **tol)
    for got, want in ((out.hidden.float(), ref.hidden.float()), (pre.hidden.float(), ref_pre.hidden.float())):
        if fast_path == "packed_bf16" and name.endswith("_moe"):
            # activations rounded to bfloat16 before the router may move a near-tied token to another expert
            close = torch.isclose(got, want, **tol)
            assert close.float().mean() > 0.99, f"{(~close).sum()} of {close.numel()} hidden values apart"
        else:
            torch.testing.assert_close(got, want, **tol)


def test_prefill_refuses_a_model_that_ignored_the_cache(tiny):
    """transformers renamed `past_key_values` to `cache`; a release that does not know the keyword it is
    given ignores it, and the cache stays empty. Prefill must say so, not the first verify."""
    from graft.backends.hf import HFBackend

    loaded = tiny("tiny_llama")
    target = HFBackend(loaded.target.model, loaded.chat.tokenizer, name="tiny_llama")
    target.reset(32)
    target.prefill([1, 2, 3, 4])
    assert target.cache_len == 4
    target._cache_keyword = "no_such_cache_argument"  # what an older or newer release would do with ours
    target.reset(32)
    with pytest.raises(RuntimeError, match="after prefilling 4 tokens the KV cache holds 0"):
        target.prefill([1, 2, 3, 4])


def test_with_the_lm_head_on_another_device_drafting_follows_it():
    """A sharded target (device_map over several GPUs) has its embeddings on the first device and its LM head
    on the last. The drafting device is the LM head's: draft heads go there and taps are gathered there.
    Simulated with the LM head on the meta device (no second GPU here)."""
    from conftest import compose

    from graft.backends.hf import HFBackend
    from graft.backends.target import concat_taps
    from graft.config.experiment import validate
    from graft.draft_models.eagle.checkpoint import random_head
    from graft.load.models import load_model

    cfg = validate(compose(["model=tiny_llama", "logger=none", "hardware.fast_path=none"]))
    loaded = load_model(cfg.model, cfg.hardware, progress=False)
    model = loaded.target.model
    model.lm_head.to("meta")
    target = HFBackend(model, loaded.chat.tokenizer)
    assert target.input_device.type == "cpu" and target.device.type == "meta"
    head = random_head(target, "eagle3", layer_ids=[1, 2, 3])
    assert {p.device.type for p in head.parameters()} == {"meta"}
    assert target.embed(torch.tensor([1, 2])).device.type == "meta"
    taps = (HiddenTap(1), HiddenTap(2))
    captured = {taps[0]: torch.ones(1, 3, 4), taps[1]: torch.zeros(1, 3, 4)}  # from two "GPUs"
    gathered = concat_taps(captured, taps, target.device)
    assert gathered.shape == (3, 8) and gathered.device.type == "meta"


def test_a_plan_that_offloads_layers_to_the_cpu_is_refused():
    from graft.load.models import ModelLoadError, check_no_offload

    check_no_offload({"model.embed_tokens": 0, "model.layers.0": 0, "lm_head": 1}, "m")  # all on GPUs
    check_no_offload({"": "cpu"}, "m")  # a CPU run is not an offload
    with pytest.raises(ModelLoadError, match="2 modules were placed on the CPU or disk"):
        check_no_offload({"model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"}, "qwen3_235b")


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3_moe"])
def test_grouped_attention_in_the_transformers_forward_matches_sdpa(name):
    """hardware.attention=graft_sdpa (the GPU default) verifies a tree without repeating keys/values per
    query head; its logits equal transformers' own SDPA."""
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model

    logits = {}
    for attention in ("sdpa", "graft_sdpa"):
        cfg = validate(
            compose([f"model={name}", "logger=none", "hardware.fast_path=none", f"hardware.attention={attention}"])
        )
        target = load_model(cfg.model, cfg.hardware, progress=False).target
        assert target.model.config._attn_implementation == attention
        tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]))
        target.reset(32)
        target.prefill([5, 17, 99, 3, 42, 8])
        logits[attention] = target.verify(tree, topology(tree.parents, target.cache_len)).logits
    torch.testing.assert_close(logits["graft_sdpa"], logits["sdpa"], rtol=1e-4, atol=1e-5)


def test_an_unknown_attention_kernel_is_refused_with_the_allowed_ones():
    from conftest import compose

    from graft.config.experiment import validate
    from graft.load.models import load_model
    from graft.schema import ConfigError

    cfg = validate(compose(["model=tiny_llama", "logger=none", "hardware.fast_path=none", "hardware.attention=fast"]))
    with pytest.raises(ConfigError, match="hardware.attention='fast'; allowed: .*graft_sdpa.*sdpa"):
        load_model(cfg.model, cfg.hardware, progress=False)


@pytest.mark.parametrize("name", ["tiny_llama:none", "tiny_qwen3:packed"])
def test_a_prefill_in_chunks_equals_one_prefill(tiny, name):
    """Long prompts are encoded in hardware.prefill_chunk pieces; logits, taps and the cache are the same."""
    target = tiny(name).target
    prompt = [(7 * i + 3) % 250 for i in range(37)]
    taps = (HiddenTap(1), HiddenTap(2, "output"))
    saved = target.prefill_chunk
    results = {}
    try:
        for chunk in (None, 8, 5):
            target.prefill_chunk = chunk
            target.reset(64)
            out = target.prefill(prompt, taps, all_logits=True)
            probe = DraftTree.root_only(21)
            after = target.verify(probe, topology(probe.parents, target.cache_len)).logits
            results[chunk] = (out.logits, out.hidden, after)
    finally:
        target.prefill_chunk = saved
    for chunk in (8, 5):
        for got, want in zip(results[chunk], results[None]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert results[None][0].shape[0] == len(prompt) and results[None][1].shape == (len(prompt), 2 * 64)


def test_the_heads_extend_in_chunks_equals_one_extend(tiny):
    from graft.draft_models.eagle.checkpoint import random_head
    from graft.methods.eagle_tree import extend

    target = tiny("tiny_llama").target
    head = random_head(target, "eagle3", seed=2, layer_ids=[1, 2, 3])
    torch.manual_seed(0)
    embeds, hidden = torch.randn(29, 64), torch.randn(29, 192)
    outs = []
    for chunk in (1024, 7, 1):
        cache = head.new_cache(8)
        first = extend(head, cache, embeds[:20], hidden[:20], chunk=chunk)
        outs.append(torch.cat([first, extend(head, cache, embeds[20:], hidden[20:], chunk=chunk)]))
        assert cache.length == 29
    for out in outs[1:]:  # one position per forward takes another kernel: float32 rounding apart
        torch.testing.assert_close(out, outs[0], rtol=1e-3, atol=1e-4)
