"""How often a decode step reads a value back to the host (each read is a device sync on CUDA), counted on
the CPU by wrapping the tensor methods that read values: a guard that keeps the autoregressive step at one
read (the accepted path) and stops Graft's from growing unnoticed. torch.cuda.set_sync_debug_mode counts the
real syncs on a GPU (scripts/gpu_check.py, part 3)."""

import collections

import pytest
import torch

from baselines.autoregressive import Autoregressive
from conftest import make_drafter
from graft.decode import generate

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


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


@pytest.mark.parametrize("method,most", [("ar", 1.1), ("pld", 1.5), ("eagle3", 1.5), ("graft", 6.0)])
def test_host_reads_per_step_stay_bounded(tiny, method, most):
    target = tiny("tiny_llama").target
    drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
    reads = host_reads_per_step(target, drafter, list(range(5, 40)))
    assert reads <= most, f"{method}: {reads:.2f} host reads per step (at most {most})"
