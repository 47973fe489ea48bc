"""The operations where the research core lets an engine be faster than plain torch.

A target backend carries one `Ops` (`target.ops`). These defaults are what the Hugging Face backend and
GPUs run; the CPU engine (graft/cpu) supplies faster ones. The core calls only this interface, so it never
imports an engine, and a new engine (a GPU kernel library, say) plugs in by subclassing it.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn


def read_back(values: Tensor) -> list:
    """The step's one read of device values to the host (the accepted path): a sync on CUDA. Every such
    read goes through here, so a GPU test can allow this one and fail on any other."""
    return values.tolist()


def read_count(count: Tensor) -> int:
    """A pruning step's one extra read (fixed-size trees): how many nodes it kept, which picks the size the
    target verifies. Apart from read_back, so a GPU test can allow exactly these two."""
    return int(count)


def upload(values: list[int], device: torch.device | str, dtype: torch.dtype = torch.long) -> Tensor:
    """Host integers onto `device`. To CUDA through pinned memory without blocking: a plain
    torch.tensor(..., device="cuda") waits for the stream, a host sync per call."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def ids_on(ids: list, device: torch.device | str) -> Tensor:
    """[n] token ids given as ints (one copy up) or one-element tensors already on `device` (no copy up)."""
    if all(isinstance(i, int) for i in ids):
        return upload(ids, device)
    return torch.cat([i.reshape(1) if isinstance(i, Tensor) else upload([i], device) for i in ids])


class DraftLayer(Protocol):
    """An engine's run of a draft head's decoder layer and its top-k log-probabilities (graft/draft_models/eagle/head.py)."""

    def step(self, embeds: Tensor, hidden: Tensor, positions: Tensor, mask: Tensor | None, cache) -> Tensor: ...

    def logits(self, out: Tensor) -> tuple[Tensor, Tensor | None]: ...

    def top_log_probs(self, out: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]: ...


class Ops:
    """Plain-torch defaults. `host_paths`: small work on CPU tensors (a tree's ancestors, the accepted path)
    walks Python lists, which costs less than a dozen tiny tensor ops; tests switch it off to count what the
    device path reads back."""

    def __init__(self, host_paths: bool = True):
        self.host_paths = host_paths

    def on_host(self, t: Tensor) -> bool:
        """Whether work on `t` takes the host path: a CPU tensor, host paths on."""
        return self.host_paths and t.device.type == "cpu"

    def top_k_rows(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(values, indices) [n, k]: each row's k largest values of x [n, V], largest first (k = 1 is
        torch.argmax's first maximum; topk orders equal values its own way)."""
        if k == 1:
            indices = x.argmax(-1, keepdim=True)
            return x.gather(-1, indices), indices
        return x.topk(k, dim=-1)

    def move_rows(self, tensors: list[Tensor], committed: int, rows: Tensor) -> bool:
        """Move rows `committed + rows` of every cache tensor [b, h, S, d] to `committed, committed + 1, ...`
        in one call; False where the engine has no such call (the cache then copies layer by layer)."""
        return False

    def product(self, linear: nn.Linear) -> nn.Module | None:
        """`linear` as a module on the engine's fast products, or None (keep nn.Linear)."""
        return None

    def draft_layer(self, head) -> DraftLayer | None:
        """The engine's run of a draft head's layer (after head.lean), or None (the head's own modules)."""
        return None

    def draft_head_dtype(self) -> str | None:
        """method.head_dtype=auto resolved for this backend: a dtype name, or None for the target's own."""
        return None

    def product_record(self, products: list[nn.Module]) -> dict:
        """For run.json: how the engine holds these products' weights (empty where there is nothing to say)."""
        return {}


PLAIN = Ops()  # what a caller without a backend (tests, tools) gets
