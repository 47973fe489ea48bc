"""The same loop on a CUDA device: every drafter kind stays lossless against the baseline there.
Skipped without CUDA (the `gpu` marker, tests/conftest.py)."""

import pytest
from conftest import compose, make_drafter

from baselines.autoregressive import Autoregressive
from graft.config.experiment import validate
from graft.data.loading import BUILTIN
from graft.decode import generate
from graft.load.models import load_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_qwen3_moe"])
def test_drafters_are_lossless_on_cuda(model_name):
    cfg = validate(compose([f"model={model_name}", "logger=none", "hardware=gpu", "model.dtype=float32"]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    assert model.target.device.type == "cuda"
    drafters = [make_drafter(name, model.target) for name in ("pld", "recycling", "eagle3", "pruned", "graft", "samd")]
    for k in range(2):
        ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])
        base = generate(model.target, Autoregressive(model.target), ids, 32, model.stop_ids)
        for drafter in drafters:
            out = generate(model.target, drafter, ids, 32, model.stop_ids)
            assert out.new_tokens == base.new_tokens, f"{drafter.method.name} on prompt {k}"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method", ["ar", "pld", "eagle3", "pruned", "graft", "graft_root", "recycling"])
def test_a_cuda_step_syncs_only_to_read_the_accepted_path(monkeypatch, method, temperature):
    """Under torch.cuda.set_sync_debug_mode("error") every step runs without a sync but its reads (graft.ops.read_back,
    the accepted path; graft.ops.read_count, the kept size of a pruning method); what a sequence does once at its
    start and end is let be."""
    import torch

    import graft.acceptance
    import graft.compose
    from graft.clock import PhaseClock
    from graft.decode import SamplingConfig

    cfg = validate(compose(["model=tiny_llama", "logger=none", "hardware=gpu", "model.dtype=float32"]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    target = model.target
    drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
    ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[0].turns[0]}])
    sampling = SamplingConfig(temperature=temperature)
    generate(target, drafter, ids, 8, set(), sampling, torch.Generator().manual_seed(0))  # warm-up: lazy setup
    reads, propose, seconds = [], drafter.propose, PhaseClock.seconds

    def allowed(read):
        def call(values):
            torch.cuda.set_sync_debug_mode("default")
            reads.append(values.numel())
            try:
                return read(values)
            finally:
                torch.cuda.set_sync_debug_mode("error")

        return call

    def strict_step(state):
        torch.cuda.set_sync_debug_mode("error")  # from the first step's draft on
        return propose(state)

    def lenient_end(clock, marks):
        torch.cuda.set_sync_debug_mode("default")  # the sequence's records: read once, after the loop
        return seconds(clock, marks)

    monkeypatch.setattr(graft.acceptance, "read_back", allowed(graft.acceptance.read_back))
    monkeypatch.setattr(graft.compose, "read_count", allowed(graft.compose.read_count))
    monkeypatch.setattr(drafter, "propose", strict_step)
    monkeypatch.setattr(PhaseClock, "seconds", lenient_end)
    try:
        out = generate(target, drafter, ids, 32, set(), sampling, torch.Generator().manual_seed(0))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    per_step = 2 if method in ("pruned", "graft", "graft_root") else 1
    assert out.steps >= 4 and len(reads) == per_step * out.steps, (method, len(reads), out.steps)
