"""Cross-device copies per decode step of a target sharded 4 ways (hardware=gpu_multi), counted on the CPU by
graft/gpu_check/device_copies.py: masks, positions and rotary tables cross to each device once a forward, KV compaction
rows once a commit, and drafting embeds on the LM head's device. So a step's copies do not grow with the
layers; and the counter catches one extra copy per layer."""

import pytest
import torch

from graft.gpu_check.device_copies import count_step_copies, logical_devices, sharded_target

NEW_TOKENS = 6


def copies(method: str, layers: int, model: str = "tiny_llama", target=None):
    return count_step_copies(method, model=model, layers=layers, new_tokens=NEW_TOKENS, target=target)


@pytest.mark.parametrize(
    "model,method",
    [("tiny_llama", "ar"), ("tiny_llama", "reference"), ("tiny_qwen3_moe", "eagle3")],
)
def test_a_steps_copies_do_not_grow_with_the_layers(model, method):
    # "reference" accepts a branch under a wrong first child every step: the commit moves KV rows on every layer
    four, eight = copies(method, 4, model), copies(method, 8, model)
    assert four.steps == eight.steps == NEW_TOKENS - 1 if method != "reference" else four.steps > 0
    assert four.tally.total > 0 and not four.tally.mismatches and not eight.tally.mismatches
    assert four.per_step == eight.per_step, (four.tally.by_caller(), eight.tally.by_caller())


def test_drafting_embeds_on_the_lm_heads_device_and_stays_lossless():
    ar, eagle3 = copies("ar", 8), copies("eagle3", 8)
    assert eagle3.tokens == ar.tokens  # greedy: every method's tokens are the baseline's
    # beyond AR's copies (the forward's inputs, once a device) only EAGLE-3's hidden-state taps cross, once a step
    extra = set(eagle3.tally.by_caller()) - set(ar.tally.by_caller())
    assert extra == {"graft/backends/target.py:<listcomp>"}, extra  # concat_taps; no embedding round trip
    assert eagle3.tally.by_caller()["graft/backends/target.py:<listcomp>"] <= 3 * eagle3.steps


def test_the_counter_catches_one_extra_copy_per_layer():
    """Negative control: a hook that copies a slice of each layer's weights to the first device adds one copy per
    forward for every layer off that device: 6 of 8 (two layers a device, four devices)."""
    from graft.backends.hf import decoder_of

    clean = copies("ar", 8)
    with logical_devices():
        target, _ = sharded_target("tiny_llama", 4, 8)

        def copy_per_layer(layer, args, kwargs):
            next(layer.parameters())[:1].to(target.input_device)

        for layer in decoder_of(target.model).layers:
            layer.register_forward_pre_hook(copy_per_layer, with_kwargs=True)
        polluted = copies("ar", 8, target=target)
    assert polluted.per_step - clean.per_step == 6
    assert polluted.tokens == clean.tokens


def test_the_simulated_devices_are_seen_by_the_backend():
    with logical_devices():
        target, _ = sharded_target("tiny_llama", 4, 8)
        assert target.input_device == torch.device("cpu", 0) and target.device == torch.device("cpu", 3)
        assert len(target.devices) == 4
