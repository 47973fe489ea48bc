"""What a decode step makes the host wait for on a GPU, counted on the CPU at the dispatcher.

Each read of a tensor's value back to the host is a device sync on CUDA, and so are the ATen ops whose
output size depends on data (nonzero, boolean-mask indexing, bincount, unique, ...) and blocking copies
up to the device. Some of them happen inside ATen's C++ (a 0-d tensor used as an index calls item()), so
they are counted with a TorchDispatchMode (graft/gpu_check/sync_counter.py), with the GPU settings
(hardware=gpu on the CPU: fixed-size trees, graft_sdpa, the top-2 gaps recorded as runs record them, host
paths off). Every greedy and sampled step of ar, pld, eagle3, pruned, graft, graft_root and recycling reads
exactly once (the accepted path), plus, for a method that prunes, one small read of the size it kept; on a
GPU torch.cuda.set_sync_debug_mode checks the same (tests/gpu/test_gpu.py, python -m graft.gpu_check). A source
scan keeps the syncing ops out of the device-path modules unless a line says why it is not on a step's path."""

import ast
import collections
import functools
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose, make_drafter

from baselines.autoregressive import Autoregressive
from graft.config.experiment import validate
from graft.decode import SamplingConfig, generate
from graft.gpu_check.sync_counter import per_step, sites_of, syncs_of
from graft.load.models import load_model
from graft.ops import Ops

SYNCING_FUNCTIONS = ("nonzero", "argwhere", "bincount", "masked_select", "unique", "unique_consecutive")
ONE_READ = ["ar", "pld", "eagle3", "pruned", "graft", "graft_root", "recycling"]
PRUNES = {"pruned", "graft", "graft_root"}  # a fixed-size tree cut to its kept size: one more small read
PROMPT = list(range(5, 40))


@pytest.fixture(autouse=True)
def device_paths(monkeypatch):
    """Count the device path's reads: the CPU's host paths (graft.ops.Ops.on_host) read values on purpose."""
    monkeypatch.setattr(Ops, "on_host", lambda self, t: False)


@functools.lru_cache(maxsize=None)
def gpu_settings(name: str):
    """A tiny model loaded as hardware=gpu loads it (fixed-size trees, graft_sdpa), on the CPU."""
    overrides = [f"model={name}", "logger=none", "hardware=gpu", "hardware.device=cpu", "hardware.fast_path=none"]
    cfg = validate(compose(overrides))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)
    assert model.target.fixed_size_trees and model.target.attention.endswith("graft_sdpa")
    return model.target


def drafter_for(method: str, target):
    return Autoregressive(target) if method == "ar" else make_drafter(method, target)


def steps_of(target, drafter, temperature: float = 0.0, new_tokens: int = 16) -> list[collections.Counter]:
    """Per decode step, what it asked of the host (the first sequence warms lazy setup up)."""
    sampling = SamplingConfig(temperature=temperature)
    generator = torch.Generator().manual_seed(0)

    def once(tokens: int):
        return generate(target, drafter, PROMPT, tokens, set(), sampling, generator, record_gaps=True)

    once(8)
    return per_step(lambda: once(new_tokens), drafter)


def step_problems(steps, reads: int) -> list[str]:
    problems = []
    for i, step in enumerate(steps):
        syncs = syncs_of(step)
        if syncs != {"read": reads}:
            problems.append(f"step {i + 1}: {syncs} (want {reads} read), at {sites_of(step)}")
    return problems


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_qwen3_moe"])
@pytest.mark.parametrize("method", ONE_READ)
def test_a_gpu_step_reads_once(method, model_name, temperature):
    """hardware=gpu settings: every step reads the accepted path once (a pruning method also the size it kept)
    and runs no other op that syncs on CUDA, greedy and sampled, dense and MoE."""
    target = gpu_settings(model_name)
    steps = steps_of(target, drafter_for(method, target), temperature)
    assert len(steps) >= 3
    problems = step_problems(steps, 2 if method in PRUNES else 1)
    assert not problems, f"{method} on {model_name} at T={temperature}:\n" + "\n".join(problems[:5])


@pytest.mark.parametrize("method", sorted(PRUNES))
def test_without_buckets_a_pruning_step_reads_once(method):
    """hardware.tree_bucket=0: every slot is verified, and the size read goes."""
    target = gpu_settings("tiny_llama")
    target.tree_bucket = 0
    try:
        steps = steps_of(target, drafter_for(method, target))
    finally:
        target.tree_bucket = 8
    assert not step_problems(steps, 1)


class _Leaky:
    """A drafter wrapper that adds one sync of a kind to every step's draft."""

    def __init__(self, inner, leak):
        self.inner, self.leak = inner, leak

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, state):
        proposal = self.inner.propose(state)
        self.leak(proposal.tree)
        return proposal

    def propose_steps(self, state):  # what a batch drafts through (graft/batch.py: lockstep)
        proposal = yield from self.inner.propose_steps(state)
        self.leak(proposal.tree)
        return proposal


LEAKS = {
    "0-d index": (lambda tree: tree.tokens[tree.tokens.argmax()], "read"),
    "torch.where(cond)": (lambda tree: torch.where(tree.tokens > 0), "nonzero"),
    "list index": (lambda tree: tree.tokens[[0]], "host tensor"),
    "boolean mask": (lambda tree: tree.tokens[tree.tokens > 0], "boolean index"),
    "tolist": (lambda tree: tree.tokens.tolist(), "read"),
}


@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_the_counter_catches_each_hidden_sync(leak):
    """Negative controls: a drafter that indexes with a 0-d tensor (item() inside ATen), calls torch.where(cond),
    indexes with a Python list, masks with booleans or reads a list is caught at every step, at its line."""
    target = gpu_settings("tiny_llama")
    action, kind = LEAKS[leak]
    drafter = _Leaky(Autoregressive(target), action)
    steps = steps_of(target, drafter, new_tokens=12)
    assert steps and all(syncs_of(step).get(kind, 0) >= (2 if kind == "read" else 1) for step in steps), steps
    assert all(any("tests/gpu/test_host_syncs.py" in site for site in sites_of(step)) for step in steps)
    assert step_problems(steps, 1), "the one-read check passes a leaking drafter"


# the methods that keep host paths with fixed-size trees: they read their decisions each step (docs/gpu.md has
# their counts), every read in the open
HOST_PATH_METHODS = ["graft_tail", "graft_refill", "graft_auto", "dflash", "dflash_tree", "dflash_graft"]
EXPLICIT_READ = re.compile(r"tolist|\.item\(|int\(|float\(|bool\(|read_back|read_count|\.cpu\(|numpy")


def hidden_reads(step: collections.Counter) -> list[str]:
    """Read sites whose line asks for no read: an index with a 0-d tensor, a tensor in an `if`, ... (ATen's item())."""
    hidden = []
    for site in sites_of(step):
        kind, _, where = site.partition(" at ")
        path, _, line = where.rpartition(":")
        if kind == "read" and path and not EXPLICIT_READ.search((ROOT / path).read_text().splitlines()[int(line) - 1]):
            hidden.append(site)
    return hidden


@pytest.mark.parametrize("method", HOST_PATH_METHODS)
def test_host_path_methods_read_in_the_open(method):
    """Methods that read their decisions each step with fixed-size trees (docs/gpu.md's table) read only at lines
    that say they read (no item() hidden in an index) and copy nothing up but through graft.ops.upload."""
    target = gpu_settings("tiny_llama")
    steps = steps_of(target, drafter_for(method, target), new_tokens=16)
    assert steps
    for i, step in enumerate(steps):
        assert not hidden_reads(step), (method, i, hidden_reads(step))
        assert set(syncs_of(step)) <= {"read"}, (method, i, sites_of(step))


def test_the_hidden_read_check_sees_a_zero_d_index():
    target = gpu_settings("tiny_llama")
    steps = steps_of(target, _Leaky(Autoregressive(target), LEAKS["0-d index"][0]), new_tokens=8)
    assert all(hidden_reads(step) for step in steps)


# Modules a GPU step runs. A call of a syncing op there needs `# sync ok: <why>` on its line: it runs
# once per run or sequence, on a host path (graft.ops.Ops.on_host), or only with growing trees.
DEVICE_PATH = [
    "graft/decode.py",
    "graft/batch.py",
    "graft/backends/slots.py",
    "graft/acceptance.py",
    "graft/tree.py",
    "graft/grafting.py",
    "graft/drafter.py",
    "graft/compose.py",
    "graft/parts.py",
    "graft/kv.py",
    "graft/layers.py",
    "graft/ops.py",
    "graft/clock.py",
    "graft/backends/target.py",
    "graft/backends/hf.py",
    "graft/draft_models/eagle/head.py",
    "graft/draft_models/dflash/model.py",
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
