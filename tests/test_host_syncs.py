"""What a decode step makes the host wait for on a GPU, counted on the CPU.

Each read of a tensor's value back to the host is a device sync on CUDA, and so are the ATen ops whose
output size depends on data (nonzero, boolean-mask indexing, bincount, unique, ...) and blocking copies
up to the device (torch.tensor(..., device=...)). With fixed-size trees (hardware.static_trees, the GPU
default) a greedy step of ar, pld, eagle3, pruned and graft makes exactly one read, the accepted path, and
none of the rest: counted here step by step by wrapping those tensor methods, and on a GPU by
torch.cuda.set_sync_debug_mode (tests/test_gpu.py, python -m graft.gpu_check). A source scan keeps the
syncing ops out of the device-path modules unless a line says why it is not on a step's path."""

import ast
import collections
import contextlib
from pathlib import Path

import pytest
import torch

from baselines.autoregressive import Autoregressive
from conftest import ROOT, make_drafter
from graft.decode import generate
from graft.ops import Ops

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")
SYNCING_FUNCTIONS = ("nonzero", "argwhere", "bincount", "masked_select", "unique", "unique_consecutive")


@pytest.fixture(autouse=True)
def device_paths(monkeypatch):
    """Count the device path's reads: the CPU's host paths (graft.ops.Ops.on_host) read values on purpose."""
    monkeypatch.setattr(Ops, "on_host", lambda self, t: False)


@contextlib.contextmanager
def counting(counts: collections.Counter):
    """Count host reads and syncing ops into `counts` while the block runs."""
    patched = {}

    def wrap(owner, name, key, when=lambda *a, **k: True):
        original = getattr(owner, name)
        patched[(owner, name)] = original

        def call(*args, **kwargs):
            counts[key] += bool(when(*args, **kwargs))
            return original(*args, **kwargs)

        setattr(owner, name, call)

    def masked(self, index, *rest) -> bool:
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in parts)

    try:
        for name in READS:
            wrap(torch.Tensor, name, "read")
        for name in SYNCING_FUNCTIONS:
            wrap(torch, name, name)
            if hasattr(torch.Tensor, name):
                wrap(torch.Tensor, name, name)
        for owner in (torch, torch.Tensor):
            wrap(owner, "repeat_interleave", "repeat_interleave", lambda *a, **k: "output_size" not in k)
        wrap(torch.Tensor, "__getitem__", "boolean index", masked)
        wrap(torch.Tensor, "__setitem__", "boolean index", masked)
        wrap(torch, "tensor", "blocking upload", lambda *a, **k: k.get("device") is not None)
        yield counts
    finally:
        for (owner, name), original in patched.items():
            setattr(owner, name, original)


def per_step_counts(target, drafter, prompt: list[int], new_tokens: int = 40) -> list[collections.Counter]:
    """What each step between the first and the last did: counted from one propose call to the next, so a
    sequence's prefill and its records at the end fall outside."""
    generate(target, drafter, prompt, 8, set())  # warm-up: lazy setup is not a step
    counts = collections.Counter()
    steps: list[collections.Counter] = []
    propose = drafter.propose

    def marked(state):
        steps.append(collections.Counter(counts))
        return propose(state)

    drafter.propose = marked
    try:
        with counting(counts):
            generate(target, drafter, prompt, new_tokens, set())
    finally:
        del drafter.propose
    return [later - earlier for earlier, later in zip(steps, steps[1:])]


def host_reads_per_step(target, drafter, prompt: list[int]) -> float:
    steps = per_step_counts(target, drafter, prompt)
    return sum(step["read"] for step in steps) / len(steps)


@pytest.mark.parametrize("method,most", [("ar", 1.0), ("pld", 1.0), ("eagle3", 1.0), ("graft", 3.5)])
def test_host_reads_per_step_stay_bounded(tiny, method, most):
    """Growing trees (hardware.static_trees off, the CPU's setting) may read their sizes; bounded."""
    target = tiny("tiny_llama").target
    drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
    reads = host_reads_per_step(target, drafter, list(range(5, 40)))
    assert reads <= most, f"{method}: {reads:.2f} host reads per step (at most {most})"


@pytest.mark.parametrize("method", ["ar", "pld", "eagle3", "pruned", "graft", "graft_root", "recycling"])
def test_fixed_size_trees_read_once_per_step(tiny, method):
    """hardware.static_trees, greedy: every step reads exactly once (the accepted path) and runs no other
    op that syncs on CUDA."""
    target = tiny("tiny_llama").target
    target.static_trees = True
    try:
        drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
        steps = per_step_counts(target, drafter, list(range(5, 40)))
    finally:
        target.static_trees = False
    assert len(steps) >= 4
    for i, step in enumerate(steps):
        syncs = {key: count for key, count in step.items() if count and key != "read"}
        assert step["read"] == 1 and not syncs, f"{method}, step {i + 1}: {step['read']} reads, {syncs}"


def test_the_step_counter_sees_a_read_and_a_syncing_op(tiny):
    """The counter can fail: a drafter that reads a value and calls nonzero each step is caught."""
    target = tiny("tiny_llama").target
    target.static_trees = True
    drafter = Autoregressive(target)
    propose = drafter.propose

    def leaky(state):
        proposal = propose(state)
        int(proposal.tree.tokens[0])
        torch.nonzero(proposal.tree.tokens)
        return proposal

    drafter.propose = leaky
    try:
        steps = per_step_counts(target, drafter, list(range(5, 40)), 16)
    finally:
        target.static_trees = False
    assert all(step["read"] == 2 and step["nonzero"] == 1 for step in steps)


# Modules a GPU step runs. A call of a syncing op there needs `# sync ok: <why>` on its line: it runs
# once per run or sequence, on a host path (graft.ops.Ops.on_host), or only with growing trees.
DEVICE_PATH = [
    "graft/decode.py",
    "graft/acceptance.py",
    "graft/tree.py",
    "graft/grafting.py",
    "graft/drafter.py",
    "graft/compose.py",
    "graft/kv.py",
    "graft/nn.py",
    "graft/ops.py",
    "graft/clock.py",
    "graft/backends/__init__.py",
    "graft/backends/hf.py",
    "graft/eagle/head.py",
    "graft/dflash/model.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "graft/methods").glob("*.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "graft/retrieval").glob("*.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "baselines").glob("*.py")),
]


def syncing_calls(source: str) -> list[tuple[int, str]]:
    """(line, op) of each call to an op that syncs inside ATen, unless its line says `# sync ok: <why>`."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        sized = name == "repeat_interleave" and any(k.arg == "output_size" for k in node.keywords)
        if name in SYNCING_FUNCTIONS or (name == "repeat_interleave" and not sized):
            excused = any("# sync ok:" in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1))
            if not excused:
                found.append((node.lineno, name))
    return found


def test_device_path_modules_call_no_syncing_op():
    offenders = [
        f"{path}:{line} {name}" for path in DEVICE_PATH for line, name in syncing_calls((ROOT / path).read_text())
    ]
    assert not offenders, "ops that sync on CUDA on the device path (add `# sync ok: <why>` if off it):\n" + "\n".join(
        offenders
    )


def test_the_scan_sees_syncing_calls():
    source = (
        "a = torch.bincount(x, minlength=4)\n"
        "b = x.nonzero()\n"
        "c = x.repeat_interleave(r, output_size=9)\n"
        "d = torch.unique(x)  # sync ok: once per run\n"
        "e = x.repeat_interleave(r)\n"
    )
    assert syncing_calls(source) == [(1, "bincount"), (2, "nonzero"), (5, "repeat_interleave")]
    assert all(Path(ROOT / path).exists() for path in DEVICE_PATH)
