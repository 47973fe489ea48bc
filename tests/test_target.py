"""The target backends against plain Hugging Face forwards: hidden-state taps and cache compaction."""

import pytest
import torch

from graft.backends import HiddenTap
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
@pytest.mark.parametrize("fast_path", ["transposed", "packed", "bf16"])
def test_fast_paths_match_the_transformers_forward(name, fast_path):
    from conftest import compose
    from graft.config import validate
    from graft.models import load_model

    def logits_and_taps(path, dtype="float32"):
        cfg = validate(compose([f"model={name}", "logger=none", f"hardware.fast_path={path}", f"model.dtype={dtype}"]))
        target = load_model(cfg.model, cfg.hardware, progress=False).target
        taps = (HiddenTap(1, "input"), HiddenTap(2, "output"))
        target.reset(64)
        pre = target.prefill(list(range(30, 70)), taps)
        tree = DraftTree(tokens=torch.tensor([7, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]))
        out = target.verify(tree, topology(tree.parents, target.cache_len), taps)
        return pre, out

    # bf16 is compared with transformers' forward in bf16: same weights, same precision
    (ref_pre, ref) = logits_and_taps("none", "bfloat16" if fast_path == "bf16" else "float32")
    pre, out = logits_and_taps(fast_path)
    tol = dict(rtol=0.02, atol=0.05) if fast_path == "bf16" else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pre.logits, ref_pre.logits, **tol)
    torch.testing.assert_close(out.logits, ref.logits, **tol)
    torch.testing.assert_close(out.hidden.float(), ref.hidden.float(), **tol)
    torch.testing.assert_close(pre.hidden.float(), ref_pre.hidden.float(), **tol)
