"""torch.compile for the target (hardware.compile): cache buckets, so that prompts of similar lengths share a
graph, and the counts a run records of what compiling did (graphs captured, CUDA graphs recorded or refused)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from graft.backends.target import TargetBackend


def capacity_bucket(needed: int) -> int:
    """The static cache size for `needed` positions: 512, then four sizes per doubling (at most 25% unused),
    so that prompts of similar lengths share one compiled graph."""
    if needed <= 512:
        return 512
    step = 1 << (needed.bit_length() - 3)
    return -(-needed // step) * step


def buckets_between(low: int, high: int) -> list[int]:
    """Every bucket that a capacity from `low` to `high` positions can land in."""
    buckets, bucket = [], capacity_bucket(low)
    while bucket <= capacity_bucket(high):
        buckets.append(bucket)
        bucket = capacity_bucket(bucket + 1)
    return buckets


def compiled_graphs() -> int:
    """Graphs torch.compile has captured in this process (each new cache bucket or tree size adds one)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


_cudagraph_records = [0]  # CUDA graphs recorded in this process (cudagraph trees), first recordings and re-records


def _count_cudagraph_record(args) -> None:
    from torch._dynamo.callback import CallbackTrigger

    if args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
        _cudagraph_records[0] += 1


def _watch_cudagraph_records() -> None:
    """cudagraph trees count no recordings, but announce each one to dynamo's compile callbacks."""
    from torch._dynamo.callback import callback_handler

    if _count_cudagraph_record not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_count_cudagraph_record)


def compile_counts() -> dict[str, int]:
    """What torch.compile did so far in this process: graphs captured, CUDA graphs recorded (cudagraph trees
    record one per graph, and again whenever a static input, e.g. a reallocated cache, moved), and graphs that
    cudagraph trees refused and ran without a CUDA graph."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "cudagraph_records": _cudagraph_records[0],
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }


def uses_cudagraphs(target: TargetBackend) -> bool:
    """Whether the target's compiled forward replays CUDA graphs (inductor's reduce-overhead or max-autotune on
    CUDA); elsewhere nothing is recorded and the counts say nothing."""
    if target.compile_mode is None or target.compile_backend != "inductor" or target.device.type != "cuda":
        return False
    import torch._inductor

    mode = None if target.compile_mode == "default" else target.compile_mode
    return bool(mode and torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))


def compiled(fn, mode: str | None, backend: str = "inductor"):
    """`fn` through torch.compile at fixed shapes (hardware.compile); modes only apply to inductor. Every cache
    bucket and tree size is a graph of its own: past dynamo's default limit of 8 it would fall back to eager."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    _watch_cudagraph_records()
    if backend != "inductor":
        return torch.compile(fn, backend=backend, dynamic=False)
    return torch.compile(fn, mode=None if mode == "default" else mode, dynamic=False)
