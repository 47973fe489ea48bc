"""A batched step on a GPU, counted on the CPU at the dispatcher (graft/gpu_check/sync_counter.py): one host sync
for the whole batch (every slot's accepted path read back in one copy), and a forward of fixed shape per bucket of
live slots. With the GPU settings (hardware=gpu on the CPU: fixed-size trees, device acceptance, host paths off)
and hardware.tree_bucket=0, as graft/run/runner.py: batched_hardware sets it for a batch."""

import collections
import contextlib
from collections import deque

import pytest
import torch

from graft import batch as batching
from graft.batch import BatchRequest, generate_batch, rows_bucket, slot_capacity
from graft.decode import SamplingConfig, generate
from graft.gpu_check.sync_counter import SyncCounter, _snapshot, sites_of, syncs_of
from graft.ops import Ops
from test_host_syncs import LEAKS, _Leaky, drafter_for, gpu_settings

LENGTHS = (12, 21, 9, 17, 10, 26)  # six prompts over four slots: newcomers enter while others decode
NEW = 10
# the batch's own code is method-blind: one of each kind of drafter (chain, tree, pruned + retrieved), greedy and sampled
CASES = [("ar", 0.0), ("pld", 0.0), ("eagle3", 0.0), ("ar", 1.0), ("graft", 1.0)]


@pytest.fixture(autouse=True)
def device_paths(monkeypatch):
    monkeypatch.setattr(Ops, "on_host", lambda self, t: False)


@pytest.fixture
def target():
    target = gpu_settings("tiny_llama")
    target.tree_bucket, target.prefill_chunk = 0, 8
    yield target
    target.tree_bucket, target.prefill_chunk = 8, None


def prompts(vocab: int, lengths=LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, min(vocab, 200), (n,), generator=generator).tolist() for n in lengths]


def batched(target, drafters, ids, temperature=0.0, count=True):
    """({prompt: Generation}, per batched step the host syncs it asked for, None for a step a sequence left in:
    its records are read back once, at its end)."""
    done, steps, counter = {}, [], SyncCounter()
    left = []
    step, leave = batching._Run.step, batching._Run.leave

    def counted_step(run, live, filling):
        before, left[:] = _snapshot(counter), []
        out = step(run, live, filling)
        steps.append(None if left else _snapshot(counter) - before)
        return out

    def noted_leave(run, live, slot):
        left.append(slot)
        return leave(run, live, slot)

    queue = deque(BatchRequest(p, torch.Generator().manual_seed(i), tag=i) for i, p in enumerate(ids))
    capacity = slot_capacity([len(p) for p in ids], NEW, max(d.max_nodes() for d in drafters))
    sampling = SamplingConfig(temperature=temperature)
    batching._Run.step, batching._Run.leave = counted_step, noted_leave
    try:
        with counter if count else contextlib.nullcontext():
            generate_batch(
                target, drafters, queue, NEW, set(), sampling, capacity, lambda r, g, s: done.__setitem__(r.tag, g)
            )
    finally:
        batching._Run.step, batching._Run.leave = step, leave
    return done, [s for s in steps if s is not None]


def problems(steps) -> list[str]:
    return [f"step {i}: {syncs_of(s)} at {sites_of(s)}" for i, s in enumerate(steps) if syncs_of(s) != {"read": 1}]


@pytest.mark.parametrize("method, temperature", CASES)
def test_a_batched_gpu_step_reads_once_for_the_whole_batch(target, method, temperature):
    drafters = [drafter_for(method, target) for _ in range(4)]
    ids = prompts(target.vocab_size)
    batched(target, drafters, [p[:6] for p in ids[:4]], temperature)  # every slot's drafter sets itself up lazily
    _, steps = batched(target, drafters, ids, temperature)
    assert len(steps) >= 5
    assert not problems(steps), f"{method} at T={temperature}:\n" + "\n".join(problems(steps)[:4])


@pytest.mark.parametrize("method", ["ar", "graft"])
def test_the_device_path_batch_decodes_what_ar_decodes_alone(target, method):
    """Greedy through device acceptance, chunked newcomers and padded buckets: each sequence's tokens are AR's."""
    ids = prompts(target.vocab_size)
    alone = [generate(target, drafter_for("ar", target), p, NEW, set()).new_tokens for p in ids]
    done, _ = batched(target, [drafter_for(method, target) for _ in range(4)], ids, count=False)
    assert [done[i].new_tokens for i in range(len(ids))] == alone


def test_per_slot_reads_fail_the_one_read_check(target, monkeypatch):
    """Negative control: acceptance read back slot by slot (B reads a step) is caught."""
    from graft import acceptance

    monkeypatch.setattr(batching, "read_accepted", lambda pending: [p.read() for p in pending])
    _, steps = batched(target, [drafter_for("ar", target) for _ in range(4)], prompts(target.vocab_size))
    assert steps and max(syncs_of(s).get("read", 0) for s in steps) >= 3, steps
    assert problems(steps)
    assert acceptance.read_accepted is not batching.read_accepted


def test_one_leaking_slot_fails_the_one_read_check(target):
    """Negative control: one slot's drafter indexing with a 0-d tensor (item() inside ATen) is caught at its line."""
    drafters = [drafter_for("ar", target) for _ in range(4)]
    drafters[2] = _Leaky(drafters[2], LEAKS["0-d index"][0])
    _, steps = batched(target, drafters, prompts(target.vocab_size)[:4])
    leaky = [s for s in steps if any("test_host_syncs.py" in site for site in sites_of(s))]
    assert leaky and problems(leaky)


def shapes_seen(target, method: str, monkeypatch) -> collections.Counter:
    seen = collections.Counter()
    forward = type(target)._forward_rows

    def recorded(self, ids, positions, mask, taps, cache):
        seen[(tuple(ids.shape), tuple(mask.shape))] += 1
        return forward(self, ids, positions, mask, taps, cache)

    monkeypatch.setattr(type(target), "_forward_rows", recorded)
    drafters = [drafter_for(method, target) for _ in range(4)]
    batched(target, drafters, prompts(target.vocab_size), count=False)
    return seen


@pytest.mark.parametrize("method", ["pruned"])
def test_a_batched_forward_has_one_shape_per_bucket_of_live_slots(target, method, monkeypatch):
    """Pruned trees of varying size and a batch that drains from 4 to 1 live slots: every forward is [rows, width]
    with rows a power of two (1, 2 or 4) and width the drafter's budget."""
    seen = shapes_seen(target, method, monkeypatch)
    width = drafter_for(method, target).max_nodes()
    assert {ids[1] for ids, _ in seen} == {width}
    assert {ids[0] for ids, _ in seen} <= {1, 2, 4} and len({ids[0] for ids, _ in seen}) >= 2, seen
    assert len(seen) <= 3


def test_without_fixed_size_trees_the_shapes_vary(target, monkeypatch):
    """Negative control: the plain path (growing trees) pads to each step's widest tree, so the check above fails."""
    monkeypatch.setattr(target, "fixed_size_trees", False)
    seen = shapes_seen(target, "pruned", monkeypatch)
    assert len({ids[1] for ids, _ in seen}) > 1 or len(seen) > 3, seen


def test_rows_bucket():
    assert [rows_bucket(n, 8) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [rows_bucket(n, 6) for n in (3, 5, 6)] == [4, 6, 6]
