"""The experts a mixture-of-experts target reads: counted per verification, and pinned to a chosen number.

A verification of n tree nodes reads every expert any node was routed to, so on an MoE target its cost
follows the distinct experts each layer's router picks (`ExpertsTouched`), not the nodes alone. To time a
verification as a function of those experts at a fixed tree size, `PinnedRouting` rewrites each router's
choice so that the forward's tokens spread over exactly m experts (each token still to its top-k, distinct).
Both hook transformers' router modules (`mlp.gate`, Qwen3-MoE and its kin), which the CPU engine calls as is.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Iterator

import torch


def routers(model) -> list[torch.nn.Module]:
    """The MoE routers of `model`'s layers (a module with a [experts, hidden] weight at `mlp.gate`)."""
    layers = getattr(getattr(model, "model", model), "layers", [])
    gates = [getattr(getattr(layer, "mlp", None), "gate", None) for layer in layers]
    return [g for g in gates if g is not None and getattr(g, "weight", None) is not None and g.weight.dim() == 2]


def routing_shape(config) -> dict | None:
    """{"experts", "top_k"} of an MoE config; None for a dense one."""
    experts, top_k = getattr(config, "num_experts", None), getattr(config, "num_experts_per_tok", None)
    return {"experts": int(experts), "top_k": int(top_k)} if experts and top_k else None


def _chosen(gate, args, output) -> torch.Tensor:
    """[tokens, top_k] expert ids the router picked: its returned indices where it returns them (a tuple
    ending in an integer tensor), else recomputed from its weight on its input."""
    if isinstance(output, tuple) and not output[-1].is_floating_point():
        return output[-1]
    hidden = args[0].reshape(-1, gate.weight.shape[-1])
    return torch.topk(hidden @ gate.weight.T.to(hidden.dtype), gate.top_k, dim=-1).indices


class ExpertsTouched:
    """Counts the distinct experts each MoE layer's router picks for the tokens of one forward."""

    def __init__(self, model):
        self.counts: list[int] = []
        self.hooks = [gate.register_forward_hook(self._hook) for gate in routers(model)]

    def _hook(self, gate, args, output) -> None:
        self.counts.append(int(_chosen(gate, args, output).unique().numel()))

    def take(self) -> list[int]:
        """The counts since the last take, one per MoE layer forward."""
        counts, self.counts = self.counts, []
        return counts

    def mean_per_layer(self) -> float | None:
        counts = self.take()
        return statistics.fmean(counts) if counts else None

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def spread(tokens: int, experts: int, top_k: int, device) -> torch.Tensor:
    """[tokens, top_k] ids over exactly min(experts, tokens + top_k - 1) experts: token i takes experts
    i, i + 1, ... i + top_k - 1 modulo `experts` (distinct, as top-k routing gives)."""
    rows = torch.arange(tokens, device=device)[:, None] + torch.arange(top_k, device=device)[None, :]
    return rows % experts


@contextlib.contextmanager
def pinned_routing(model, experts: int) -> Iterator[None]:
    """Every router of `model` sends the forward's tokens to `experts` experts (0 .. experts - 1) instead of
    its own choice; the routing weights stay the router's. For timing only: the outputs are not the model's."""

    def hook(gate, args, output):
        if not (isinstance(output, tuple) and not output[-1].is_floating_point()):
            raise TypeError(f"{type(gate).__name__} does not return its expert ids: routing cannot be pinned")
        ids = output[-1]
        pinned = spread(ids.shape[0], experts, ids.shape[-1], ids.device).to(ids.dtype)
        return (*output[:-1], pinned)

    # prepended: other hooks on the router (ExpertsTouched) see the pinned choice
    hooks = [gate.register_forward_hook(hook, prepend=True) for gate in routers(model)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
