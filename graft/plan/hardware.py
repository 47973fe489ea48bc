"""Which device, and how many GPUs, a run uses, from its hardware config; and the memory check on them.

hardware=auto (the default) takes CUDA where torch sees a device and the CPU engine elsewhere. Its settings
come from the config it stands for (configs/hardware/auto.yaml interpolates each one with
graft/config/hydra_setup.py's `auto_hardware`: gpu.yaml's on CUDA, cpu.yaml's elsewhere), so an override such as
hardware.fast_path=none still wins. The GPU count needs the memory plan, so it is settled at start-up (`resolve_hardware`): the
smallest count whose per-GPU plan fits (model.num_gpus=auto) or model.num_gpus; more than one shards the
layers as gpu_multi.yaml does (device_map auto over those GPUs). `${gpus_needed:}` (`register_resolvers`)
gives a scheduler that count before the run.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from graft.config.experiment import validate
from graft.config.hydra_setup import group_options
from graft.config.hydra_setup import hardware_profile as profile
from graft.config.schema import ExperimentConfig, HardwareConfig
from graft.plan.capacity import cuda_free_memory, machine_capacity
from graft.plan.fit import check as check_plan
from graft.plan.fit import largest_batch
from graft.plan.jobs import gpu_type_bytes, host_memory_gb, reference_gpus
from graft.plan.memory import MemoryPlan, placement_map, plan_memory
from graft.plan.placement import planned_gpus
from graft.schema import ConfigError


def cuda_available() -> bool:
    return torch.cuda.is_available()


def no_cuda(hardware: HardwareConfig) -> ConfigError:
    """The one-line refusal of a CUDA config on a machine without CUDA, with the configs that run here."""
    here = [name for name in group_options("hardware") if profile(name).get("device") != "cuda"]
    return ConfigError(
        f"hardware={hardware.name} asks for CUDA (hardware.device='cuda') and torch sees no CUDA device; "
        f"allowed on this machine: {', '.join(f'hardware={name}' for name in here)}"
    )


def resolve_device(hardware: HardwareConfig) -> torch.device:
    if hardware.device == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    if hardware.device == "cuda" and not cuda_available():
        raise no_cuda(hardware)
    return torch.device(hardware.device)


@dataclass(frozen=True)
class HardwareChoice:
    """What a run runs on and why, printed at start-up and recorded in run.json (hardware.choice)."""

    config: str  # the hardware config asked for
    device: str  # "cpu" | "cuda"
    gpus: int  # 0 on the CPU
    gpu_name: str | None
    why: str

    @property
    def line(self) -> str:
        if self.device == "cpu":
            return f"hardware={self.config} -> cpu: {self.why}"
        return f"hardware={self.config} -> cuda: {self.gpus} x {self.gpu_name}, {self.why}"

    def record(self) -> dict:
        return {**dataclasses.asdict(self), "line": self.line}


def resolve_hardware(cfg: ExperimentConfig) -> tuple[ExperimentConfig, HardwareChoice]:
    """`cfg` with its device settled (and on CUDA model.num_gpus a number), and the choice. Refuses a CUDA
    config where torch sees no CUDA device."""
    hardware = cfg.hardware
    check_threads(hardware.num_threads)
    device = resolve_device(hardware)
    check_tensor_parallel(cfg, device)
    if device.type != "cuda" and cfg.model.num_gpus != "auto":
        raise ConfigError(
            f"model.num_gpus={cfg.model.num_gpus} asks for GPUs, and this run is on {device.type} "
            f"(hardware={hardware.name}{', no CUDA device' if hardware.device == 'auto' else ''}); "
            "allowed there: model.num_gpus=auto (the default), or run on a GPU node"
        )
    if device.type != "cuda":
        why = "no CUDA device" if hardware.device == "auto" else "as configured"
        settled = dataclasses.replace(hardware, device=device.type)
        return dataclasses.replace(cfg, hardware=settled), HardwareChoice(hardware.name, device.type, 0, None, why)
    gpus, why = cuda_gpus(cfg)
    settled = dataclasses.replace(hardware, device="cuda")
    if hardware.device == "auto" and gpus > 1:  # gpu_multi.yaml's settings: the layers sharded over these GPUs
        settled = dataclasses.replace(settled, device_map=hardware.device_map or "auto")
    model = dataclasses.replace(cfg.model, num_gpus=gpus)
    choice = HardwareChoice(hardware.name, "cuda", gpus, torch.cuda.get_device_name(0), why)
    return dataclasses.replace(cfg, hardware=settled, model=model), choice


def check_tensor_parallel(cfg: ExperimentConfig, device: torch.device) -> None:
    """Tensor parallel shards a checkpoint as transformers loads it, one process per CUDA GPU under torchrun.
    Elsewhere it would be silently ignored (a random model is built, not loaded; the CPU engine's forward and
    the runner, which writes records from every process, know no shards): refused in one line."""
    if not cfg.hardware.tensor_parallel:
        return
    if device.type != "cuda":
        why = f"this run is on {device.type}"
    elif cfg.model.source != "pretrained":
        why = f"model={cfg.model.name} is built from {cfg.model.source} weights, not loaded from a checkpoint"
    else:
        return
    raise ConfigError(
        f"hardware.tensor_parallel=true needs CUDA GPUs and a pretrained checkpoint (transformers' tp_plan='auto' "
        f"under torchrun; graft's CPU forward, random models and one-writer records have no tensor-parallel "
        f"path) and {why}; allowed: hardware.tensor_parallel=false, or hardware=gpu_multi for a sharded model"
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which a SLURM job or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_threads(num_threads: int | None) -> None:
    """More torch threads than cores only makes them wait for each other: refused before anything loads."""
    cores = usable_cores()
    if num_threads is not None and num_threads > cores:
        raise ConfigError(
            f"hardware.num_threads={num_threads}, but this process may use {cores} cores; "
            f"allowed: null (the thread policy's choice) or 1..{cores}"
        )


def cuda_gpus(cfg: ExperimentConfig) -> tuple[int, str]:
    """How many GPUs a CUDA run uses, and why."""
    hardware = cfg.hardware
    if hardware.tensor_parallel:
        return int(os.environ.get("WORLD_SIZE", 1)), "tensor parallel, one process per GPU (WORLD_SIZE)"
    if hardware.device != "auto" and not placement_map(cfg):
        return 1, f"hardware={hardware.name} without a device_map: one device"
    return planned_gpus(cfg, cuda_free_memory())


def job_config(root) -> ExperimentConfig:
    """The validated config of a job before it runs, from `root`, its unresolved config (in a launcher config,
    on a node that may have no GPU); run.out_dir is left out (it names Hydra's output folder, not known yet)."""
    from omegaconf import OmegaConf

    def plain(value):  # a section, a list (methods) or null (methods: null)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    sections = {
        key: plain(root[key]) for key in ("model", "method", "methods", "dataset", "hardware", "paths") if key in root
    }
    sections["run"] = {key: root.run[key] for key in root.run if key != "out_dir"}
    return validate(sections)


def gpu_bytes(gpu: str | float | None) -> int | None:
    """A GPU's memory from a type name (h200, h100, a100) or a size in GB; None: an H200."""
    if gpu is None or gpu == "":
        return None
    if isinstance(gpu, str) and not gpu.replace(".", "", 1).isdigit():
        return gpu_type_bytes(gpu)
    return int(float(gpu) * 1e9)


def gpus_for_job(root, gpu: str | float | None = None) -> int:
    """The GPUs a job asks its scheduler for before it runs (`${gpus_needed:}`): model.num_gpus when it is a
    number, else the memory plan's count on GPUs of type or size `gpu` (an H200 when not given)."""
    return reference_gpus(job_config(root), gpu_bytes(gpu))


def register_resolvers() -> None:
    """`${gpus_needed:}`, `${slurm_gres:}` and `${host_memory_gb:}` for the configs that ask a scheduler for
    resources (run.py registers them; graft/config/hydra_setup.py's register_schemas cannot: the plan reaches the CPU
    engine's layouts, which the config module must not)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("gpus_needed", gpus_needed, replace=True)
    OmegaConf.register_new_resolver("slurm_gres", slurm_gres, replace=True)
    OmegaConf.register_new_resolver("host_memory_gb", host_memory_for_job, replace=True)


def gpus_needed(gpu: str | float | None = None, *, _root_) -> int:
    """`${gpus_needed:}`; `${gpus_needed:h100}` or `${gpus_needed:85}` for other GPUs: gpus_for_job on the
    config it sits in."""
    return gpus_for_job(_root_, gpu)


def slurm_gres(gpu_type: str, constraint: str | None = None, *, _root_) -> str:
    """`${slurm_gres:h200}` -> "gpu:h200:<count>", the count sized on that type; with a constraint (a cluster that
    names GPU types as node features) the type goes there and the gres is "gpu:<count>"."""
    count = gpus_for_job(_root_, gpu_type)
    return f"gpu:{count}" if constraint else f"gpu:{gpu_type.lower()}:{count}"


def host_memory_for_job(*, _root_) -> int:
    """`${host_memory_gb:}`: the host RAM in GB a GPU job asks for (graft/plan/jobs.host_memory_gb)."""
    return host_memory_gb(plan_memory(job_config(_root_), "cuda"))


def check_memory(cfg: ExperimentConfig) -> MemoryPlan | None:
    """Plan `cfg`'s memory on the device it will run on (graft/plan/memory.py) and refuse it if this machine cannot
    hold it, on each GPU it will use. Reads only configs and local files: no download, no model built."""
    if cfg.run.skip_memory_check:
        return None
    device_type = resolve_device(cfg.hardware).type
    plan = plan_memory(cfg, device_type)
    if plan.known:
        capacity = machine_capacity(device_type, plan.placement, plan.num_gpus)  # a batch: one device
        if capacity is not None:
            batched = cfg.run.batch_size > 1 and plan.total > capacity.usable
            check_plan(
                plan,
                capacity,
                on_gpus=plan_memory(cfg, "cuda") if device_type == "cpu" else None,
                batch_fits=largest_batch(cfg, device_type, capacity.usable) if batched else None,
            )
    return plan
