"""This harness's EAGLE-3 chain and DFlash against vLLM's, on the embedded model with the shipped head and block
drafter, the same prompts through the same chat template, greedy, float32 on both sides: mean accepted length
(tau, tokens after the first over decoding steps) agrees within 2%, and a perturbed head on vLLM's side moves
it further than that (the check can fail). vLLM runs in its own environment (`make peers`, which .ci/run builds);
without one these tests skip. Whether vLLM's outputs equal vLLM's own AR is printed, not asserted."""

import json
from pathlib import Path

import pytest
import torch

from graft.peers import vllm_runner as vllm

REPO = Path(__file__).resolve().parents[2]
PEER_PYTHON = REPO / ".peers" / "vllm" / "bin" / "python"
TOLERANCE = 0.02
NEW_TOKENS = 64
pytestmark = [
    pytest.mark.slow,
    pytest.mark.embedded,
    pytest.mark.skipif(not PEER_PYTHON.is_file(), reason="no vLLM environment (make peers builds .peers/vllm)"),
]


@pytest.fixture(scope="module")
def setting():
    """The embedded model on the engine, its chat, and the built-in quick set's first turns as prompt ids."""
    from conftest import compose

    from graft.config.experiment import validate
    from graft.data.loading import load_prompts
    from graft.load.models import load_chat, load_model

    cfg = validate(compose(["logger=none", "dataset=builtin_quick", f"run.max_new_tokens={NEW_TOKENS}"]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    chat, path, stop_ids = load_chat(cfg.model)
    prompts = [
        chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in load_prompts(cfg.dataset, None, chat)
    ]
    return cfg, model, path, sorted(stop_ids), prompts


def harness_tau(setting, method: str, **keys) -> float:
    from graft.decode import SamplingConfig, generate
    from graft.registry import build_drafter, method_config

    cfg, model, _, _, prompts = setting
    from conftest import method_yaml

    raw = {**dict(method_yaml(method)), **keys}
    drafter = build_drafter(method_config(raw, cfg.model.draft_head, cfg.model.block_drafter), model.target)
    runs = [generate(model.target, drafter, ids, NEW_TOKENS, model.stop_ids, SamplingConfig()) for ids in prompts]
    return sum(g.step_tokens for g in runs) / sum(g.steps for g in runs)


def vllm_run(setting, speculative: dict | None) -> tuple[float, list[list[int]]]:
    """vLLM's tau over the prompts as the peer runner computes it, and its outputs."""
    _, _, path, stop_ids, prompts = setting
    job = {"kind": "serve", "model": path, "dtype": "float32", "max_model_len": 2048, "speculative": speculative,
           "stop_token_ids": stop_ids, "temperature": 0.0, "seed": 0, "enforce_eager": True}  # fmt: skip
    worker = vllm.Worker(PEER_PYTHON, job)
    try:
        turns = [vllm.peer_turn(worker.request(ids, NEW_TOKENS), prompt_tokens=len(ids), text="") for ids in prompts]
    finally:
        worker.close()
    return sum(t["step_tokens"] for t in turns) / sum(t["steps"] for t in turns), [t["token_ids"] for t in turns]


@pytest.fixture(scope="module")
def vllm_ar(setting):
    return vllm_run(setting, None)[1]


def perturbed(folder: Path, into: Path) -> Path:
    """A copy of a head whose matrices carry noise of half their own spread: a head that drafts worse."""
    from safetensors.torch import load_file, save_file

    into.mkdir()
    for item in folder.iterdir():
        if item.suffix != ".safetensors":
            (into / item.name).write_bytes(item.read_bytes())
    weights = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    noisy = {
        name: w + 0.5 * w.float().std() * torch.randn(w.shape, generator=generator).to(w.dtype) if w.dim() == 2 else w
        for name, w in weights.items()
    }
    save_file(noisy, into / "model.safetensors", metadata={"format": "pt"})
    return into


def _report(name: str, ours: float, theirs: float, outputs, ar) -> None:
    equal = sum(a == b for a, b in zip(outputs, ar))
    print(f"{name}: harness tau {ours:.3f}, vLLM tau {theirs:.3f} ({theirs / ours - 1:+.1%}); "
          f"vLLM outputs equal to vLLM's AR: {equal}/{len(ar)}")  # fmt: skip


@pytest.mark.parametrize("k", [2, 4])
def test_our_eagle3_chain_and_vllms_eagle3_agree_on_tau(setting, vllm_ar, k, tmp_path):
    from graft.hub import checkpoint_dir

    cfg = setting[0]
    head = checkpoint_dir(cfg.model.draft_head)
    ours = harness_tau(setting, "eagle3_chain", depth=k, total_tokens=k + 1)
    theirs, outputs = vllm_run(setting, {"method": "eagle3", "model": str(head), "num_speculative_tokens": k})
    _report(f"eagle3 k={k}", ours, theirs, outputs, vllm_ar)
    assert abs(theirs / ours - 1) <= TOLERANCE
    if k == 4:  # negative control: a worse head on vLLM's side is seen
        worse = perturbed(head, tmp_path / "head")
        moved, _ = vllm_run(setting, {"method": "eagle3", "model": str(worse), "num_speculative_tokens": k})
        print(f"eagle3 k={k}, perturbed head on vLLM's side: vLLM tau {moved:.3f} ({moved / ours - 1:+.1%})")
        assert abs(moved / ours - 1) > TOLERANCE


def test_our_dflash_and_vllms_dflash_agree_on_tau(setting, vllm_ar, tmp_path):
    from graft.hub import checkpoint_dir

    cfg = setting[0]
    drafter = checkpoint_dir(cfg.model.block_drafter)
    block = json.loads((drafter / "config.json").read_text())["block_size"]
    ours = harness_tau(setting, "dflash")
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": block - 1}
    theirs, outputs = vllm_run(setting, spec)
    _report("dflash", ours, theirs, outputs, vllm_ar)
    assert abs(theirs / ours - 1) <= TOLERANCE
    worse = perturbed(drafter, tmp_path / "drafter")
    moved, _ = vllm_run(setting, {**spec, "model": str(worse)})
    print(f"dflash, perturbed drafter on vLLM's side: vLLM tau {moved:.3f} ({moved / ours - 1:+.1%})")
    assert abs(moved / ours - 1) > TOLERANCE
