"""hardware=auto (graft/plan/hardware.py): the CPU engine where torch sees no CUDA device, CUDA with as many GPUs as
the per-GPU memory plan needs where it does (faked here: this machine has none), the choice printed and recorded
in run.json; a CUDA config refused in one line where there is none; `${gpus_needed:}` for a scheduler."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import compose

from graft.config.experiment import compose as compose_default
from graft.config.experiment import validate
from graft.config.hydra_setup import CONFIG_DIR
from graft.config.hydra_setup import hardware_profile as profile
from graft.plan.hardware import check_memory, register_resolvers, resolve_hardware
from graft.plan.memory import plan_memory
from graft.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]
H200 = 141 * 10**9  # free bytes per GPU the fake node reports


def config(*overrides: str):
    return validate(compose([*overrides, "logger=none"]))


@pytest.fixture
def cuda_node(monkeypatch):
    """A node of `gpus` fake H200s with H200 bytes free each; returns a setter for the count."""

    def make(gpus: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (H200, 150 * 10**9))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")

    return make


def test_the_default_is_auto():
    assert compose_default(["logger=none"])["hardware"]["name"] == "auto"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_without_cuda_auto_is_the_cpu_engine():
    auto, cpu = compose(["hardware=auto"])["hardware"], compose(["hardware=cpu"])["hardware"]
    assert {k: (auto[k], cpu[k]) for k in auto if auto[k] != cpu[k]} == {
        "name": ("auto", "cpu"),
        "device": ("auto", "cpu"),
    }
    assert auto["fast_path"] == "packed"  # the CPU engine's fast path, as hardware=cpu
    cfg, choice = resolve_hardware(config("model=tiny_llama", "method=ar", "hardware=auto"))
    assert cfg.hardware.device == "cpu" and cfg.hardware.fast_path == "packed" and cfg.model.num_gpus == "auto"
    assert choice.line == "hardware=auto -> cpu: no CUDA device" and choice.record()["gpus"] == 0
    same = config("model=llama31_8b", "method=graft", "hardware=cpu")
    assert plan_memory(cfg, "cpu").total > 0
    assert plan_memory(config("model=llama31_8b", "method=graft", "hardware=auto"), "cpu") == plan_memory(same, "cpu")


def test_an_override_still_wins_over_the_auto_setting():
    assert config("hardware=auto", "hardware.fast_path=none").hardware.fast_path == "none"


def test_auto_stands_for_every_setting_of_the_configs_it_chooses():
    """auto.yaml interpolates each key cpu.yaml or gpu.yaml states; gpu_multi.yaml differs from gpu.yaml only by
    sharding (device_map auto), which resolve_hardware applies for more than one GPU."""
    auto = yaml.safe_load((CONFIG_DIR / "hardware" / "auto.yaml").read_text())
    stated = (set(profile("cpu")) | set(profile("gpu"))) - {"name", "device"}
    assert {k for k, v in auto.items() if str(v).startswith("${auto_hardware:")} == stated
    one, several = compose(["hardware=gpu"])["hardware"], compose(["hardware=gpu_multi"])["hardware"]
    assert {k for k in one if one[k] != several[k]} == {"name", "device_map"} and several["device_map"] == "auto"


def test_on_cuda_auto_takes_the_gpus_the_plan_needs(cuda_node):
    cuda_node(8)
    gpu = compose(["hardware=gpu"])["hardware"]
    auto = config("model=qwen3_235b", "method=graft", "hardware=auto")
    assert {k: v for k, v in vars(auto.hardware).items() if k not in ("name", "device")} == {
        k: v for k, v in gpu.items() if k not in ("name", "device")
    }  # gpu.yaml's settings: no fast path, grouped attention, fixed-size trees
    cfg, choice = resolve_hardware(auto)
    assert choice.line == "hardware=auto -> cuda: 4 x NVIDIA H200, plan needs 4"
    assert cfg.model.num_gpus == 4 and cfg.hardware.device == "cuda" and cfg.hardware.device_map == "auto"
    assert check_memory(cfg).num_gpus == 4  # each of the four holds its share

    small, choice = resolve_hardware(config("model=llama31_8b", "method=graft", "hardware=auto"))
    assert choice.line == "hardware=auto -> cuda: 1 x NVIDIA H200, plan needs 1"
    assert small.hardware.device_map is None and small.model.num_gpus == 1  # gpu.yaml's: one device

    pinned, choice = resolve_hardware(config("model=llama31_8b", "method=graft", "hardware=auto", "model.num_gpus=2"))
    assert choice.why == "model.num_gpus=2" and pinned.hardware.device_map == "auto"  # honoured, sharded


def test_explicit_gpu_configs_keep_their_meaning(cuda_node):
    cuda_node(8)
    one, choice = resolve_hardware(config("model=llama31_8b", "method=graft", "hardware=gpu"))
    assert choice.gpus == 1 and "one device" in choice.why and one.hardware.device_map is None
    multi, choice = resolve_hardware(config("model=qwen3_235b", "method=graft", "hardware=gpu_multi"))
    assert choice.gpus == 4 and multi.hardware.device_map == "auto"


def test_too_big_for_the_node_names_the_gpu_that_overflows(cuda_node):
    cuda_node(3)
    cfg, choice = resolve_hardware(config("model=qwen3_235b", "method=graft", "hardware=auto"))
    assert cfg.model.num_gpus == 3 and "fits on none of the 3 visible GPUs" in choice.why
    with pytest.raises(ConfigError, match=r"overflows GPU 0 \(of 3 used\) by .* GB.*It needs about 4 GPUs"):
        check_memory(cfg)


def test_a_batch_takes_one_gpu_and_one_too_large_for_it_is_refused_naming_the_batch_size_that_fits(cuda_node):
    """A batched run decodes on one device (graft/run/batched.batched_hardware): hardware=auto takes one GPU at
    B > 1, and paper_long's Llama-3.1-8B at B = 32 (279.5 GB of KV cache) is refused on it in one line."""
    cuda_node(4)
    overrides = ("experiment=paper_long", "model=llama31_8b", "hardware=auto")
    cfg, choice = resolve_hardware(config(*overrides, "run.batch_size=32"))
    assert choice.line == "hardware=auto -> cuda: 1 x NVIDIA H200, run.batch_size=32: a batched run decodes on one GPU"
    assert cfg.model.num_gpus == 1 and cfg.hardware.device_map is None
    with pytest.raises(ConfigError) as refused:
        check_memory(cfg)
    message = str(refused.value)
    usable = H200 * 0.9  # the fake GPU's free bytes less 10% headroom
    fits = max(
        b for b in range(1, 32) if plan_memory(config(*overrides, f"run.batch_size={b}"), "cuda").total <= usable
    )
    assert message.startswith("model=llama31_8b overflows GPU 0 (of 1 used) by") and "\n" not in message
    assert (
        f"run.batch_size={fits} is the most that fits here" in message and "run.batch_size=32 decodes on one" in message
    )
    assert "It needs about" not in message  # more GPUs would not help a batch
    resolved, _ = resolve_hardware(config(*overrides, f"run.batch_size={fits}"))
    assert check_memory(resolved).batch_size == fits


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_cuda_without_a_device_is_one_line_naming_what_runs_here():
    with pytest.raises(ConfigError) as refused:
        resolve_hardware(config("model=tiny_llama", "method=ar", "hardware=gpu"))
    message = str(refused.value)
    assert message.startswith("hardware=gpu asks for CUDA (hardware.device='cuda') and torch sees no CUDA device")
    assert message.endswith("allowed on this machine: hardware=auto, hardware=cpu, hardware=cpu_plain")
    proc = subprocess.run(
        [sys.executable, "run.py", "hardware=gpu", "model=tiny_llama", "method=ar", "logger=none"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {message}"]


def gpus_needed(*overrides: str, argument: str = "") -> int:
    """`${gpus_needed:<argument>}` as a launcher config would resolve it, in the composed (unresolved) config."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    from graft.config.hydra_setup import register_schemas

    register_schemas()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[*overrides, "logger=none"])
    with open_dict(cfg):
        cfg.probe = f"${{gpus_needed:{argument}}}"
    return cfg.probe


def test_gpus_needed_gives_a_scheduler_a_number():
    assert gpus_needed("model=qwen3_235b", "methods=[eagle3,pruned,graft]") == 4  # on H200s
    assert gpus_needed("model=qwen3_235b", "methods=[eagle3,pruned,graft]", argument="85") == 7  # 80 GB GPUs
    assert gpus_needed("model=llama31_8b") == 1
    assert gpus_needed("model=qwen3_235b", "model.num_gpus=8") == 8  # a number is honoured
    assert gpus_needed("experiment=smoke") == 1  # a single-method run: methods null


def test_a_launcher_asking_gpus_needed_gets_the_plans_count():
    """What configs/hydra/launcher/graft_slurm.yaml needs for gpus_per_node now that model.num_gpus is auto."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra is not installed")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from graft.config.hydra_setup import register_schemas
    from graft.config.overrides import prepare_overrides

    register_schemas()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for model, gpus in [("llama31_8b", 1), ("qwen3_235b", 4)]:
            overrides = ["experiment=paper_short", f"model={model}", "hydra/launcher=graft_slurm"]
            overrides.append("hydra.launcher.gpus_per_node=${gpus_needed:}")
            cfg = hydra_compose(config_name="config", overrides=prepare_overrides(overrides), return_hydra_config=True)
            assert cfg.hydra.launcher.gpus_per_node == gpus


def test_the_choice_is_logged_and_recorded_in_run_json(tmp_path, caplog):
    from graft.run.runner import run

    caplog.set_level(logging.INFO, logger="graft")

    overrides = ["model=tiny_llama", "method=ar", "hardware=auto", "run.num_prompts=1", "run.max_new_tokens=2"]
    resolved = compose([*overrides, "logger=none", "run.warmup=false", "run.progress=false"])
    resolved["run"]["out_dir"] = str(tmp_path)
    run(validate(resolved), resolved)
    choice = json.loads((tmp_path / "run.json").read_text())["hardware"]["choice"]
    expected = "cpu" if not torch.cuda.is_available() else "cuda"
    assert choice["device"] == expected and choice["config"] == "auto" and choice["line"] in caplog.messages


def test_more_threads_than_cores_are_refused_before_loading(monkeypatch):
    import graft.plan.hardware

    monkeypatch.setattr(graft.plan.hardware, "usable_cores", lambda: 2)
    with pytest.raises(ConfigError, match=r"hardware.num_threads=1000, but this process may use 2 cores; .* 1\.\.2"):
        resolve_hardware(config("model=tiny_llama", "method=ar", "hardware=cpu", "hardware.num_threads=1000"))
    resolve_hardware(config("model=tiny_llama", "method=ar", "hardware=cpu", "hardware.num_threads=2"))


@pytest.mark.parametrize("hardware", ["cpu", "cpu_plain"])
def test_tensor_parallel_where_it_cannot_run_is_refused_in_one_line(hardware):
    """transformers' tp_plan="auto" shards a checkpoint as it loads, one process per GPU; on a CPU (or for a random
    model) graft has no tensor-parallel path, and the flag used to be ignored without a word."""
    with pytest.raises(ConfigError) as refused:
        resolve_hardware(
            config("model=tiny_llama", "method=ar", f"hardware={hardware}", "hardware.tensor_parallel=true")
        )
    message = str(refused.value)
    assert message.startswith("hardware.tensor_parallel=true needs CUDA GPUs and a pretrained checkpoint")
    assert "this run is on cpu" in message and message.endswith(
        "allowed: hardware.tensor_parallel=false, or hardware=gpu_multi for a sharded model"
    )
    resolve_hardware(config("model=tiny_llama", "method=ar", f"hardware={hardware}"))  # without it: runs


def test_tensor_parallel_of_a_random_model_on_cuda_is_refused(cuda_node):
    cuda_node(2)
    with pytest.raises(ConfigError, match="model=tiny_llama is built from random weights"):
        resolve_hardware(config("model=tiny_llama", "method=ar", "hardware=gpu", "hardware.tensor_parallel=true"))
