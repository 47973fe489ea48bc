"""What this machine offers a run (machine_capacity): on the CPU the RAM the kernel reports as available, on
CUDA the free memory of each GPU the model will use, with the headroom a plan leaves on each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# share of each GPU's free memory left unplanned: the CUDA context, allocator fragmentation, the library's workspaces
CUDA_HEADROOM = 0.10


@dataclass(frozen=True)
class Capacity:
    """Bytes a run may plan for on this machine, and where the figure came from."""

    usable: int  # after headroom
    offered: int  # as the machine reports it
    source: str
    device: str  # "cpu" | "cuda"
    gpus_visible: int = 0
    free_per_gpu: tuple[int, ...] = ()  # free bytes of each GPU the model will use, in order
    headroom: float = 0.0

    @property
    def per_gpu(self) -> int | None:
        """Free bytes of the first GPU used (sizes the GPUs a refusal asks for)."""
        return self.free_per_gpu[0] if self.free_per_gpu else None

    def usable_on(self, index: int) -> int:
        return int(self.free_per_gpu[index] * (1 - self.headroom))


def cpu_capacity(available: int, source: str = "CPU RAM available") -> Capacity:
    return Capacity(usable=available, offered=available, source=source, device="cpu")


def cuda_capacity(free_per_gpu: list[int], gpus_visible: int, headroom: float = CUDA_HEADROOM) -> Capacity:
    """The GPUs the model will use, each with its free memory."""
    offered = sum(free_per_gpu)
    source = f"free CUDA memory on {len(free_per_gpu)} of {gpus_visible} visible GPU(s)"
    return Capacity(
        usable=int(offered * (1 - headroom)),
        offered=offered,
        source=source,
        device="cuda",
        gpus_visible=gpus_visible,
        free_per_gpu=tuple(free_per_gpu),
        headroom=headroom,
    )


def available_ram() -> tuple[int | None, str]:
    """Bytes of RAM the kernel could give this process now (MemAvailable), or psutil's figure."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "CPU RAM available, /proc/meminfo"  # kB
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None, "no /proc/meminfo and no psutil"
    return int(psutil.virtual_memory().available), "CPU RAM available, psutil"


def cuda_free_memory() -> list[int]:
    """Free bytes on every visible GPU (opens a CUDA context on each)."""
    import torch

    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


def machine_capacity(device_type: str, placement: str = "one", num_gpus: int | None = None) -> Capacity | None:
    """What this machine offers the model on `device_type`; None when it cannot tell. On CUDA `placement`
    is "one" (one device), "sharded" (a device_map over the first `num_gpus` GPUs, every visible one when
    None) or "tensor_parallel" (one process per GPU under torchrun: this process's GPU, WORLD_SIZE times).
    Only the GPUs this process will use are asked for their free memory, which opens a CUDA context on each."""
    if device_type == "cpu":
        available, source = available_ram()
        return None if available is None else cpu_capacity(available, source)
    import torch

    visible = torch.cuda.device_count()
    if placement == "sharded":
        used = min(num_gpus or visible, visible)  # more than are visible is refused by count (check)
        return cuda_capacity([torch.cuda.mem_get_info(i)[0] for i in range(used)], visible)
    if placement == "tensor_parallel":
        local = int(os.environ.get("LOCAL_RANK", 0))
        return cuda_capacity([torch.cuda.mem_get_info(local)[0]] * int(os.environ.get("WORLD_SIZE", 1)), visible)
    return cuda_capacity([torch.cuda.mem_get_info(torch.cuda.current_device())[0]], visible)
