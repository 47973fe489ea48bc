"""Where each part of a memory plan lives on k GPUs (place: the layers split as Accelerate's balanced
device_map splits them, the embeddings on the first, the LM head and what works on its logits on the last), and
how many GPUs a plan needs (gpus_needed; planned_gpus at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.plan.capacity import CUDA_HEADROOM
from graft.plan.memory import MemoryPlan, gb, plan_memory

if TYPE_CHECKING:
    from graft.config.schema import ExperimentConfig


@dataclass(frozen=True)
class GpuShare:
    """What one GPU holds: bytes by part."""

    index: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def breakdown(self) -> str:
        return ", ".join(f"{name} {gb(size)}" for name, size in self.parts.items() if size)


def layer_split(num_layers: int, gpus: int) -> list[int]:
    """Layers per GPU as Accelerate's balanced device_map spreads them, roughly: num_layers / gpus each,
    the first GPUs taking one more where it does not divide (the last one holds the LM head)."""
    base, extra = divmod(num_layers, gpus)
    return [base + (index < extra) for index in range(gpus)]


def place(plan: MemoryPlan, gpus: int) -> list[GpuShare]:
    """What each of `gpus` GPUs holds: its layers and their KV cache, a prefill chunk's activations and the
    attention mask on every one, the embeddings on the first, and on the last the LM head with what works
    on its logits (graft/backends: drafting lives on the LM head's device)."""
    if plan.placement == "tensor_parallel":
        return tensor_parallel_shares(plan, gpus)
    num_layers = plan.shape.num_layers
    last = 0 if plan.shape.tie_embeddings else gpus - 1  # a tied LM head stays with the embeddings
    shares = []
    for index, layers in enumerate(layer_split(num_layers, gpus)):
        parts = {
            f"{layers} layers": layers * plan.layer_weights,
            "fast-path layouts": plan.weight_layouts * layers // num_layers,  # they follow their layers
            "KV cache": layers * plan.kv_layer,
            "prefill activations": plan.activations,
            "attention mask": plan.masks,
        }
        if index == 0:
            parts["embeddings"] = plan.embedding_weights
        if index == last:
            parts["LM head"] = plan.output_weights
            parts[plan.draft_label()] = plan.draft_head
            if gpus > 1 and last != 0 and plan.draft_head:  # drafting embeds here (TargetBackend.embed's table)
                parts["drafting embeddings"] = plan.embedding_weights
            parts["verification logits"] = plan.tree_logits
            parts["prefill logits"] = plan.prefill_logits
        shares.append(GpuShare(index, parts))
    return shares


def tensor_parallel_shares(plan: MemoryPlan, gpus: int) -> list[GpuShare]:
    """tp_plan="auto": every GPU holds 1/gpus of each layer's weights and KV heads, and its own copy of the
    rest (each process runs the whole decode loop on gathered logits)."""
    parts = {
        "weight shard": (plan.weights + plan.weight_layouts) // gpus,
        "KV cache shard": plan.kv_cache // gpus,
        plan.draft_label(): plan.draft_head,
        "working set": plan.working,
    }
    return [GpuShare(index, dict(parts)) for index in range(gpus)]


def gpus_needed(plan: MemoryPlan, free_per_gpu: list[int], headroom: float = CUDA_HEADROOM) -> int | None:
    """The smallest count k for which every one of the first k GPUs holds its share (free memory less
    `headroom`); None when none does. More GPUs than layers would hold nothing more."""
    for k in range(1, min(len(free_per_gpu), plan.shape.num_layers) + 1):
        if all(share.total <= free * (1 - headroom) for share, free in zip(place(plan, k), free_per_gpu)):
            return k
    return None


def gpus_needed_like(plan: MemoryPlan, gpu_bytes: int) -> int | None:
    """gpus_needed on identical GPUs of `gpu_bytes` free each."""
    return gpus_needed(plan, [gpu_bytes] * plan.shape.num_layers)


def planned_gpus(cfg: ExperimentConfig, free_per_gpu: list[int]) -> tuple[int, str]:
    """How many of these GPUs a sharded run uses, and why: model.num_gpus when it is a number, else the
    smallest count whose per-GPU plan fits (every one of them when none does or the shape is unknown: the
    memory check then says why)."""
    if isinstance(cfg.model.num_gpus, int):
        return cfg.model.num_gpus, f"model.num_gpus={cfg.model.num_gpus}"
    if cfg.run.batch_size > 1:  # the memory check then says whether it fits, and which batch size would
        return 1, f"run.batch_size={cfg.run.batch_size}: a batched run decodes on one GPU"
    plan = plan_memory(cfg, "cuda")
    if not plan.known:
        return len(free_per_gpu), "unknown model shape, every visible GPU"
    needed = gpus_needed(plan, free_per_gpu)
    if needed is None:
        return len(free_per_gpu), f"the memory plan fits on none of the {len(free_per_gpu)} visible GPUs"
    return needed, f"plan needs {needed}"
