"""A batched step on a GPU, counted on the CPU at the dispatcher (graft/gpu_check/sync_counter.py): one host sync
for the whole batch (every slot's accepted path read back in one copy), and a forward of fixed shape per bucket of
live slots. With the GPU settings (hardware=gpu on the CPU: fixed-size trees, device acceptance, host paths off)
and hardware.tree_bucket=0, as graft/run/batched.py: batched_hardware sets it for a batch."""

import collections
import contextlib
from collections import deque

import pytest
import torch
from test_host_syncs import LEAKS, _Leaky, drafter_for, gpu_settings, steps_of

from graft import batch as batching
from graft.batch import BatchRequest, generate_batch, rows_bucket, slot_capacity
from graft.config.hydra_setup import group_options
from graft.decode import SamplingConfig, generate
from graft.gpu_check.batched import allowed_reads, counted_rounds
from graft.gpu_check.sync_counter import SyncCounter, _snapshot, sites_of, syncs_of
from graft.ops import Ops

LENGTHS = (12, 21, 9, 17, 10, 26)  # six prompts over four slots: newcomers enter while others decode
TOGETHER = (8, 8, 8, 8, 12, 10)  # the first four start together and (one token a step) leave together
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


def batched(target, drafters, ids, temperature=0.0, count=True, with_leavers=False):
    """({prompt: Generation}, per round of the loop the host syncs it asked for: graft/gpu_check/batched.py:
    counted_rounds, the newcomers' prefill gap, the step and the one read of the leavers' records), each round
    {"syncs", "left", "first"}. Without `with_leavers`, the syncs of the rounds no one left or joined in alone."""
    done, counter = {}, SyncCounter()
    queue = deque(BatchRequest(p, torch.Generator().manual_seed(i), tag=i) for i, p in enumerate(ids))
    capacity = slot_capacity([len(p) for p in ids], NEW, max(d.max_nodes() for d in drafters))
    sampling = SamplingConfig(temperature=temperature)
    with counted_rounds({"syncs": lambda: _snapshot(counter)}) as found:
        with counter if count else contextlib.nullcontext():
            generate_batch(
                target, drafters, queue, NEW, set(), sampling, capacity, lambda r, g, s: done.__setitem__(r.tag, g)
            )
    rounds = [{"syncs": r["counts"]["syncs"], "left": r["left"], "first": r["first"]} for r in found]
    if with_leavers:
        return done, rounds
    return done, [r["syncs"] for r in rounds if not r["left"] and not r["first"]]


def problems(steps) -> list[str]:
    return [f"step {i}: {syncs_of(s)} at {sites_of(s)}" for i, s in enumerate(steps) if syncs_of(s) != {"read": 1}]


@pytest.mark.parametrize("method, temperature", CASES)
def test_a_round_with_leavers_and_newcomers_reads_once_more_for_all_leavers(target, method, temperature):
    """Rounds of the loop in which sequences leave or newcomers finish their prompts are counted too: one read
    for every leaver's records together, one per newcomer's first token, beside the step's one."""
    drafters = [drafter_for(method, target) for _ in range(4)]
    ids = prompts(target.vocab_size, lengths=TOGETHER)
    batched(target, drafters, [p[:6] for p in ids[:4]], temperature)
    _, rounds = batched(target, drafters, ids, temperature, with_leavers=True)
    assert any(r["left"] >= 2 for r in rounds) and any(r["first"] for r in rounds), rounds
    wrong = [r for r in rounds if syncs_of(r["syncs"]) != {"read": allowed_reads(r)}]
    assert not wrong, [(syncs_of(r["syncs"]), r["left"], r["first"], sites_of(r["syncs"])) for r in wrong[:3]]


def test_leavers_read_one_by_one_fail_the_round_check(target, monkeypatch):
    """Negative control: each leaver's records read in a copy of its own (a round of two leavers reads 3)."""
    from graft import decode

    read_kept = decode.read_kept
    monkeypatch.setattr(batching, "read_kept", lambda sequences: [read_kept([s]) for s in sequences])
    ids = prompts(target.vocab_size, lengths=TOGETHER)
    _, rounds = batched(target, [drafter_for("ar", target) for _ in range(4)], ids, with_leavers=True)
    assert any(syncs_of(r["syncs"]).get("read", 0) > allowed_reads(r) for r in rounds if r["left"] >= 2), rounds


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

    monkeypatch.setattr(acceptance, "read_accepted", lambda pending: [p.read() for p in pending])
    _, steps = batched(target, [drafter_for("ar", target) for _ in range(4)], prompts(target.vocab_size))
    assert steps and max(syncs_of(s).get("read", 0) for s in steps) >= 3, steps
    assert problems(steps)


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

    def recorded(self, ids, positions, mask, taps, cache, compiled=False):
        seen[(tuple(ids.shape), tuple(mask.shape))] += 1
        return forward(self, ids, positions, mask, taps, cache, compiled)

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


# the configs whose batched rounds read nothing beyond the stated reads (allowed_reads); the others keep host
# paths with fixed-size trees (docs/gpu.md: graft_auto, graft_refill, graft_tail, dflash_tree, dflash_graft) or
# read the committed tokens for a host-side retriever (suffix, samd) or time their parts (eagle3_auto)
ONE_READ_BATCH = [
    "ar", "dflash", "eagle3", "eagle3_chain", "eagle3_static", "graft", "graft_noprune", "graft_root", "pld",
    "pruned", "recycling",
]  # fmt: skip


@pytest.mark.parametrize("method", group_options("method"))
def test_every_method_config_reads_in_a_batch_at_most_what_its_slots_read_alone(target, method):
    """Every method config at B = 4 on the GPU settings, rounds with leavers and newcomers included: beside a
    round's stated reads (allowed_reads), nothing for the one-read configs, and for the others at most what each
    of the four slots' steps reads at batch 1 beyond its one, and one per newcomer's drafter reading its prompt
    (suffix, samd: as their batch-1 prefill does). A batch adds no read of its own."""
    alone = steps_of(target, drafter_for(method, target), new_tokens=12)
    per_slot = max(sum(syncs_of(step).values()) for step in alone) - 1
    drafters = [drafter_for(method, target) for _ in range(4)]
    ids = prompts(target.vocab_size, lengths=TOGETHER)
    batched(target, drafters, [p[:6] for p in ids[:4]])
    _, rounds = batched(target, drafters, ids, with_leavers=True)
    extra = [sum(syncs_of(r["syncs"]).values()) - allowed_reads(r) for r in rounds]
    bounds = [0 if method in ONE_READ_BATCH else 4 * per_slot + r["first"] for r in rounds]
    assert rounds and all(e <= b for e, b in zip(extra, bounds)), (method, per_slot, extra, bounds)
    if method in ONE_READ_BATCH:  # the counts are exact: a read lost would show too
        assert min(extra) == 0
