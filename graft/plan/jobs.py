"""What a GPU job asks its scheduler for before it runs (the SLURM launcher's resolvers in
graft/plan/hardware.py): the GPUs of a type its memory plan needs (reference_gpus) and host memory (host_memory_gb).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from graft.plan.capacity import CUDA_HEADROOM
from graft.plan.fit import REFERENCE_GPUS, batch_fit, largest_batch, needs_text
from graft.plan.memory import MemoryPlan, gb, plan_memory
from graft.plan.placement import gpus_needed_like
from graft.plan.sizes import GB
from graft.schema import ConfigError

if TYPE_CHECKING:
    from graft.config.schema import ExperimentConfig


# The GPU types a SLURM job may ask for (the launcher's gres or constraint, GRAFT_SLURM_GPU), by the bytes
# REFERENCE_GPUS (graft/plan/fit.py) states
GPU_TYPES = {"h200": 150.1e9, "h100": 85.0e9, "a100": 85.0e9}
HOST_PROCESS_GB = 32  # host RAM of a GPU job's process itself: Python, torch, CUDA contexts, tokenizer, datasets
HOST_MEMORY_STEP_GB = 32  # a job's mem_gb rounds up to steps of this
UNKNOWN_HOST_MEMORY_GB = 64  # mem_gb for a model of unknown shape (the launcher's one figure before it was sized)


def reference_gpus(cfg: ExperimentConfig, gpu_bytes: int | None = None) -> int:
    """GPUs a job asks a scheduler for before it runs (the SLURM launcher, `${gpus_needed:}`):
    model.num_gpus when it is a number, else the plan's count on GPUs of `gpu_bytes` (an H200 when not
    given); 1 for an unknown shape. A batched run (run.batch_size > 1) decodes on one GPU: one, or refused
    naming the largest batch size that fits one, rather than GPUs the run could not use."""
    if isinstance(cfg.model.num_gpus, int):
        return cfg.model.num_gpus
    plan = plan_memory(cfg, "cuda")
    if not plan.known:
        return 1
    size = gpu_bytes or REFERENCE_GPUS[0][1]
    needed = gpus_needed_like(plan, size)
    if plan.batch_size > 1 and needed != 1:
        usable = int(size * (1 - CUDA_HEADROOM))
        raise ConfigError(
            f"run.batch_size={plan.batch_size} does not fit one GPU with {gb(size)} ({gb(usable)} after keeping "
            f"{CUDA_HEADROOM:.0%} as headroom), and a batched run decodes on one GPU (it does not shard the model): "
            f"{batch_fit(largest_batch(cfg, 'cuda', usable), 'one')}. {needs_text(plan)}"
        )
    if needed is None:
        raise ConfigError(f"model={plan.model} fits no count of GPUs with {gb(size)}: {needs_text(plan)}")
    return needed


def gpu_type_bytes(gpu_type: str) -> int:
    """The memory of a GPU type a scheduler is asked for (GRAFT_SLURM_GPU), refused in one line when unknown."""
    if gpu_type.lower() not in GPU_TYPES:
        raise ConfigError(f"GPU type {gpu_type!r}; allowed: {', '.join(GPU_TYPES)}")
    return int(GPU_TYPES[gpu_type.lower()])


def host_memory_gb(plan: MemoryPlan) -> int:
    """Host RAM a GPU job asks its scheduler for (the SLURM launcher's mem_gb): the target's weights and the draft
    models once (loading reads every checkpoint shard through host memory, and a cluster that counts the page
    cache of memory-mapped files counts them) plus the process itself, rounded up to steps of 32 GB."""
    if not plan.known:
        return UNKNOWN_HOST_MEMORY_GB
    # the draft caches live on the GPU: host memory keeps batch 1's figure (one slot's) at any run.batch_size
    other_slots = plan.draft_kv - plan.draft_kv // plan.batch_size
    need = (plan.weights + plan.draft_head - other_slots) / GB + HOST_PROCESS_GB
    return math.ceil(need / HOST_MEMORY_STEP_GB) * HOST_MEMORY_STEP_GB
