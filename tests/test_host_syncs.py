"""How often a decode step reads a value back to the host (each read is a device sync on CUDA), counted on
the CPU by wrapping the tensor methods that read values: a guard that keeps the autoregressive step at one
read (the accepted path) and stops Graft's from growing unnoticed. With fixed-size trees
(hardware.static_trees) every tree method must stay at that one read, with no operation whose output shape
depends on data (nonzero, boolean-mask indexing) and no host-to-device copy (torch.tensor) per step: each
of those is a sync on CUDA too. torch.cuda.set_sync_debug_mode counts the real syncs on a GPU
(python -m graft.gpu_check, part 3)."""

import collections

import pytest
import torch

from baselines.autoregressive import Autoregressive
from conftest import make_drafter
from graft.decode import generate
from graft.ops import Ops

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


@pytest.fixture(autouse=True)
def device_paths(monkeypatch):
    """Count the device path's reads: the CPU's host paths (graft.ops.Ops.on_host) read values on purpose."""
    monkeypatch.setattr(Ops, "on_host", lambda self, t: False)


def host_reads_per_step(target, drafter, prompt: list[int]) -> float:
    generate(target, drafter, prompt, 8, set())  # warm-up: lazy setup is not a step
    counts = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        def read(self, *args, **kwargs):
            counts[name] += 1
            return originals[name](self, *args, **kwargs)

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, counting(name))
        out = generate(target, drafter, prompt, 40, set())
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    return sum(counts.values()) / out.steps


def shape_dependent_ops_per_step(target, drafter, prompt: list[int]) -> tuple[float, dict]:
    """What syncs on CUDA besides reads, per step: nonzero, boolean-mask indexing and torch.tensor calls,
    counted over a short and a long generation so that what a sequence does once (its prefill, the
    drafter's reset, the records at the end) cancels out."""
    generate(target, drafter, prompt, 8, set())
    get, put, nonzero, method_nonzero, tensor = (
        torch.Tensor.__getitem__,
        torch.Tensor.__setitem__,
        torch.nonzero,
        torch.Tensor.nonzero,
        torch.tensor,
    )

    def masked(index) -> bool:
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in parts)

    def counted(new_tokens: int) -> tuple[collections.Counter, int]:
        counts = collections.Counter()

        def counting_get(self, index):
            counts["boolean index"] += masked(index)
            return get(self, index)

        def counting_put(self, index, value):
            counts["boolean index"] += masked(index)
            return put(self, index, value)

        def counting(name, fn):
            def call(*args, **kwargs):
                counts[name] += 1
                return fn(*args, **kwargs)

            return call

        try:
            torch.Tensor.__getitem__, torch.Tensor.__setitem__ = counting_get, counting_put
            torch.nonzero, torch.Tensor.nonzero = counting("nonzero", nonzero), counting("nonzero", method_nonzero)
            torch.tensor = counting("torch.tensor", tensor)
            out = generate(target, drafter, prompt, new_tokens, set())
        finally:
            torch.Tensor.__getitem__, torch.Tensor.__setitem__ = get, put
            torch.nonzero, torch.Tensor.nonzero, torch.tensor = nonzero, method_nonzero, tensor
        return counts, out.steps

    short, short_steps = counted(16)
    long, long_steps = counted(48)
    extra = {k: long[k] - short[k] for k in long}
    return sum(extra.values()) / max(long_steps - short_steps, 1), extra


@pytest.mark.parametrize("method,most", [("ar", 1.1), ("pld", 1.5), ("eagle3", 1.5), ("graft", 3.5)])
def test_host_reads_per_step_stay_bounded(tiny, method, most):
    target = tiny("tiny_llama").target
    drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
    reads = host_reads_per_step(target, drafter, list(range(5, 40)))
    assert reads <= most, f"{method}: {reads:.2f} host reads per step (at most {most})"


@pytest.mark.parametrize("method", ["ar", "eagle3", "pruned", "graft", "graft_root", "recycling"])
def test_fixed_size_trees_read_once_per_step(tiny, method):
    """hardware.static_trees: one read per step (the accepted path), plus what each sequence reads once at
    its start and end; per step nothing whose shape depends on data and no copy up to the device."""
    target = tiny("tiny_llama").target
    target.static_trees = True
    try:
        drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
        assert method == "ar" or drafter.static
        prompt = list(range(5, 40))
        reads = host_reads_per_step(target, drafter, prompt)
        others, counts = shape_dependent_ops_per_step(target, drafter, prompt)
    finally:
        target.static_trees = False
    assert reads <= 1.3, f"{method}: {reads:.2f} host reads per step"
    assert others <= 0.05, f"{method}: {others:.2f} shape-dependent ops or copies per step ({counts})"
