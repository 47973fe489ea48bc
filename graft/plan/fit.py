"""The verdict on a memory plan against what this machine offers (check): a plan that needs more than the CPU
or any one GPU offers is refused in one ConfigError line with its figures, and what would hold it (the GPUs it
needs, or the largest run.batch_size that fits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graft.plan.capacity import CUDA_HEADROOM, Capacity
from graft.plan.memory import MemoryPlan, gb, plan_memory
from graft.plan.placement import gpus_needed_like, place
from graft.schema import ConfigError

if TYPE_CHECKING:
    from graft.config.schema import ExperimentConfig


# What a refusal on a CPU machine sizes the need in: the bytes torch reports as these GPUs' total memory
# (an "80 GB" H100 or A100 holds 79.2 GiB = 85.0e9 bytes; a "141 GB" H200 139.8 GiB = 150.1e9 bytes).
REFERENCE_GPUS = (("H200", 150.1e9), ("H100/A100 80GB", 85.0e9))


def largest_batch(cfg: ExperimentConfig, device_type: str, usable: int) -> int:
    """The largest run.batch_size below cfg's whose plan fits `usable` bytes on one device (a batched run's
    placement); 0 when not even one sequence does."""
    low, high = 0, cfg.run.batch_size - 1  # the plan grows with the batch: bisect
    while low < high:
        middle = (low + high + 1) // 2
        if plan_memory(cfg, device_type, batch_size=middle).total <= usable:
            low = middle
        else:
            high = middle - 1
    return low


def batch_fit(fits: int | None, where: str) -> str:
    """The batch size that fits `where` (largest_batch's `fits`; None: not computed)."""
    if fits is None:
        return "a smaller run.batch_size needs less"
    if fits == 0:
        return f"not even one sequence fits {where} (run.batch_size=1 may shard the model over several GPUs)"
    return f"run.batch_size={fits} is the most that fits {where}"


def what_it_needs(
    plan: MemoryPlan, capacity: Capacity, on_gpus: MemoryPlan | None = None, batch_fits: int | None = None
) -> str:
    """The GPUs that would hold the run (`on_gpus`: its plan on CUDA; else this plan), each holding its
    share, in GPUs like this machine's or the common sizes; for a batched run, which batch size fits here
    (`batch_fits`, largest_batch's)."""
    if plan.batch_size > 1:
        said = f"run.batch_size={plan.batch_size} decodes on one device (a batched run does not shard the model)"
        return f"{said}: {batch_fit(batch_fits, 'here')}."
    sized = on_gpus if on_gpus is not None else plan
    if capacity.device == "cuda" and capacity.per_gpu:
        gpus = [(f"GPUs with {gb(capacity.per_gpu)} free like this machine's", capacity.per_gpu)]
    else:
        gpus = [(f"{name} ({gb(size)})", size) for name, size in REFERENCE_GPUS]
    counts = [gpus_needed_like(sized, size) for _, size in gpus]
    options = " or ".join(
        f"{count} {label}" if count else f"more than {sized.shape.num_layers} {label}"
        for count, (label, _) in zip(counts, gpus)
    )
    hint = f"; model.hardware_hint: {plan.hardware_hint}" if plan.hardware_hint else ""
    return (
        f"It needs about {options}, each GPU holding its share with {CUDA_HEADROOM:.0%} kept as headroom "
        f"(hardware=auto takes that many on such a node; model.num_gpus={plan.num_gpus or 'auto'}){hint}."
    )


def offered_text(capacity: Capacity) -> str:
    if capacity.headroom:
        return (
            f"{gb(capacity.offered)} ({capacity.source}), {gb(capacity.usable)} after keeping "
            f"{capacity.headroom:.0%} as headroom"
        )
    return f"{gb(capacity.offered)} ({capacity.source})"


ESCAPE = "run.skip_memory_check=true skips this check."


def check(
    plan: MemoryPlan, capacity: Capacity, on_gpus: MemoryPlan | None = None, batch_fits: int | None = None
) -> None:
    """Refuse (ConfigError) a plan that needs more GPUs than are visible, more than a GPU offers on any
    one of them, or more bytes than the CPU offers; `on_gpus`, the same run planned for CUDA, sizes the
    GPUs a refusal on the CPU asks for; `batch_fits`, the run.batch_size that would fit (largest_batch)."""
    if not plan.known:
        return
    if capacity.device == "cuda":
        check_gpus(plan, capacity, batch_fits)
        return
    if plan.total > capacity.usable:
        raise ConfigError(
            f"{needs_text(plan)}; this machine offers {offered_text(capacity)}. "
            f"{what_it_needs(plan, capacity, on_gpus, batch_fits)} {ESCAPE}"
        )


def needs_text(plan: MemoryPlan) -> str:
    at = f" at run.batch_size={plan.batch_size}" if plan.batch_size > 1 else ""
    return f"model={plan.model}{at} needs about {gb(plan.total)} (GB = 1e9 bytes: {plan.breakdown()})"


def check_gpus(plan: MemoryPlan, capacity: Capacity, batch_fits: int | None = None) -> None:
    """Each GPU's share (place) against that GPU's free memory less headroom; the refusal names the GPU
    that overflows most, by how much, and what it holds."""
    if plan.num_gpus and plan.num_gpus > capacity.gpus_visible:
        raise ConfigError(
            f"model={plan.model} asks for {plan.num_gpus} GPUs (model.num_gpus={plan.num_gpus}) and this machine "
            f"shows {capacity.gpus_visible} (torch.cuda.device_count()); {needs_text(plan)}. {ESCAPE}"
        )
    shares = place(plan, len(capacity.free_per_gpu))
    over = {s.index: s.total - capacity.usable_on(s.index) for s in shares if s.total > capacity.usable_on(s.index)}
    if not over:
        return
    worst = shares[max(over, key=over.get)]
    others = [f"GPU {i} by {gb(excess)}" for i, excess in over.items() if i != worst.index]
    also = f"; also over: {', '.join(others)}" if others else ""
    raise ConfigError(
        f"model={plan.model} overflows GPU {worst.index} (of {len(shares)} used) by {gb(over[worst.index])}: it "
        f"needs {gb(worst.total)} there ({worst.breakdown()}) and GPU {worst.index} offers "
        f"{gb(capacity.usable_on(worst.index))} ({gb(capacity.free_per_gpu[worst.index])} free less "
        f"{capacity.headroom:.0%} headroom){also}. {needs_text(plan)}. "
        f"{what_it_needs(plan, capacity, batch_fits=batch_fits)} {ESCAPE}"
    )
