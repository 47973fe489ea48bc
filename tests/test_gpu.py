"""The same loop on a CUDA device: every drafter kind stays lossless against the baseline there.
Skipped without CUDA (the `gpu` marker, tests/conftest.py)."""

import pytest

from baselines.autoregressive import Autoregressive
from conftest import compose, make_drafter
from graft.config import validate
from graft.data import BUILTIN
from graft.decode import generate
from graft.models import load_model

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
