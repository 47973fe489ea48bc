"""Batched decoding (graft/batch.py): every sequence of a batch decodes what it decodes alone.

Greedy, each sequence's tokens equal batch-1 AR's on the same prompt for every method config, and its accept
lengths equal the method's own batch-1 run (the drafters are per sequence); sequences leave and newcomers take
their slots; prompts of different lengths share a step; one sequence stops at the context limit while the others
go on.
"""

from collections import deque

import pytest
import torch
from conftest import make_drafter

from graft.batch import BatchRequest, generate_batch, slot_capacity
from graft.config.hydra_setup import group_options
from graft.decode import SamplingConfig, generate

GREEDY = SamplingConfig()
MAX_NEW = 20
LENGTHS = (5, 17, 9, 30, 12, 7)  # six prompts over four slots: two newcomers take the slots of finished ones


def _prompts(vocab: int, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, min(vocab, 200), (n,), generator=generator).tolist() for n in lengths]


def run_batch(target, method: str, prompts, batch: int, max_new: int = MAX_NEW, stop_ids=frozenset(), **params):
    """{prompt index: Generation} and the slot each sequence ran in, decoding `prompts` `batch` at a time."""
    drafters = [make_drafter(method, target, **params) for _ in range(batch)]
    for other in drafters[1:]:
        other.share_with(drafters[0])  # as the runner does: a no-op unless the method shares state
    done, slots = {}, {}

    def finished(request, gen, slot):
        done[request.tag], slots[request.tag] = gen, slot

    queue = deque(BatchRequest(ids, tag=i) for i, ids in enumerate(prompts))
    capacity = slot_capacity([len(p) for p in prompts], max_new, drafters[0].max_nodes())
    steps = generate_batch(target, drafters, queue, max_new, set(stop_ids), GREEDY, capacity, finished)
    return done, slots, steps, drafters


# the cost-measuring methods (graft_auto, eagle3_auto) time this machine: their budgets, and so their accept lengths,
# differ from run to run; their tokens are still checked
TIMED = {"graft_auto", "eagle3_auto"}


# ":packed": the CPU engine, whose batch is ragged segments of one forward; else the transformers forward, padded
# rows; ":bfloat16": the engine's cache in bfloat16 (hardware.cache_dtype)
@pytest.mark.parametrize("batch", [4, 8])
@pytest.mark.parametrize(
    "name", ["tiny_llama", "tiny_qwen3", "tiny_llama:packed", "tiny_qwen3:packed", "tiny_qwen3:packed:bfloat16"]
)
def test_every_method_in_a_batch_decodes_what_it_decodes_alone(tiny, name, batch):
    target = tiny(name).target
    prompts = _prompts(target.vocab_size)
    alone_ar = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY) for p in prompts]
    for method in group_options("method"):
        batched, _, _, _ = run_batch(target, method, prompts, batch=batch)
        alone = make_drafter(method, target)
        for i, ids in enumerate(prompts):
            assert batched[i].new_tokens == alone_ar[i].new_tokens, f"{method} on prompt {i}: not AR's tokens"
            if method not in TIMED:
                own = generate(target, alone, ids, MAX_NEW, set(), GREEDY)
                assert batched[i].accept_lengths == own.accept_lengths, f"{method} on prompt {i}"


def test_finished_sequences_leave_and_newcomers_take_their_slots(tiny):
    target = tiny("tiny_llama").target
    prompts = _prompts(target.vocab_size)
    done, slots, steps, _ = run_batch(target, "graft", prompts, batch=4)
    assert sorted(done) == list(range(6))
    assert set(slots.values()) <= {0, 1, 2, 3}
    assert sorted(slots[i] for i in range(4)) == [0, 1, 2, 3]  # the first four fill the batch
    assert {slots[4], slots[5]} <= {slots[i] for i in range(4)}  # the last two take freed slots
    assert max(len(step["slots"]) for step in steps) == 4
    assert steps[-1]["slots"] and len(steps[-1]["slots"]) < 4  # the batch drains at the end
    assert all(step["nodes"] >= len(step["slots"]) for step in steps)


def test_one_sequence_stops_at_the_context_limit_while_the_others_go_on(tiny):
    target = tiny("tiny_llama").target
    prompts = _prompts(target.vocab_size, lengths=(30, 5, 8))
    saved = target.max_context
    target.max_context = 40  # prompt 0 reaches it after 10 tokens, the others never
    try:
        alone = [generate(target, make_drafter("graft", target), p, MAX_NEW, set(), GREEDY) for p in prompts]
        done, _, _, _ = run_batch(target, "graft", prompts, batch=3)
    finally:
        target.max_context = saved
    assert alone[0].stop_reason == "context" and done[0].stop_reason == "context"
    assert len(done[0].new_tokens) < MAX_NEW and [len(done[i].new_tokens) for i in (1, 2)] == [MAX_NEW, MAX_NEW]
    for i in range(3):
        assert done[i].new_tokens == alone[i].new_tokens, i


def test_a_stop_token_ends_one_sequence_and_the_batch_goes_on(tiny):
    target = tiny("tiny_llama").target
    prompts = _prompts(target.vocab_size, lengths=(6, 9, 11))
    alone = [generate(target, make_drafter("pld", target), p, MAX_NEW, set(), GREEDY) for p in prompts]
    stop = alone[1].new_tokens[5]  # a token prompt 1 produces midway
    want = [generate(target, make_drafter("pld", target), p, MAX_NEW, {stop}, GREEDY) for p in prompts]
    done, _, _, _ = run_batch(target, "pld", prompts, batch=3, stop_ids={stop})
    assert done[1].stop_reason == "stop_token"
    for i in range(3):
        assert (done[i].new_tokens, done[i].stop_reason) == (want[i].new_tokens, want[i].stop_reason), i


def test_the_cpu_engine_batch_runs_its_native_loop_once_a_step_for_every_slot(tiny, monkeypatch):
    """On the engine a step is one lean_rows call over every live slot's tree (and the newcomers' chunks riding
    in it), never one forward per slot."""
    target = tiny("tiny_llama:packed").target
    assert target.ragged_rows and target.native is not None
    calls, rows = [], target.lean.native.lean_rows
    monkeypatch.setattr(target.lean, "native", _Recording(target.lean.native, "lean_rows", 8, calls))
    prompts = _prompts(target.vocab_size)
    done, _, steps, _ = run_batch(target, "graft", prompts, batch=4)
    alone = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY) for p in prompts]
    assert [done[i].new_tokens for i in range(6)] == [a.new_tokens for a in alone]
    assert len(calls) == len(steps)  # one forward a step, prefill rounds included
    assert max(segments for segments in calls) == 4
    assert rows is not None


class _Recording:
    """The native module with one function's calls recorded: the length of its argument `arg` (the segments), or
    what `summary(args)` says of them."""

    def __init__(self, module, name: str, arg: int, calls: list, summary=None):
        self._module, self._name, self._calls = module, name, calls
        self._summary = summary or (lambda args: len(args[arg]))

    def __getattr__(self, name):
        found = getattr(self._module, name)
        if name != self._name:
            return found

        def recorded(*args):
            self._calls.append(self._summary(args))
            return found(*args)

        return recorded


def test_a_shared_recycling_table_learns_from_every_sequence_and_stays_lossless(tiny):
    """method.table=shared: the batch's slots read and teach one table (never cleared between sequences), so the
    accept lengths change but every token is still AR's; per_sequence (the default) keeps one table each."""
    target = tiny("tiny_llama").target
    prompts = _prompts(target.vocab_size)
    alone_ar = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY) for p in prompts]
    shared, _, _, drafters = run_batch(target, "graft", prompts, batch=4, table="shared")
    tables = {id(d.retrievers[0].recycler) for d in drafters}
    assert len(tables) == 1
    assert all(shared[i].new_tokens == alone_ar[i].new_tokens for i in range(len(prompts)))
    _, _, _, own = run_batch(target, "graft", prompts, batch=4)
    assert len({id(d.retrievers[0].recycler) for d in own}) == 4


def most_positions_between_steps(events: list) -> int:
    """The most prompt positions encoded between two batched steps while sequences were decoding ("step": one
    that left sequences decoding; "idle": one after which none was, so what follows stalls nobody; a number: the
    positions one prefill forward encoded)."""
    most, run = 0, None
    for event in events:
        if event in ("step", "idle"):
            most = max(most, run or 0)
            run = 0 if event == "step" else None
        elif run is not None:
            run += event
    return max(most, run or 0)


def test_a_newcomer_stalls_the_others_one_chunk_at_a_time(tiny, monkeypatch):
    """hardware.prefill_chunk=4: a 40-token prompt is encoded 4 positions between two steps of the sequences
    already decoding (short prompts share a gap), and every sequence still decodes AR's tokens."""
    from graft import batch as batching
    from graft.backends.target import PromptPrefill

    target = tiny("tiny_llama").target
    prompts = _prompts(target.vocab_size, lengths=(5, 6, 40, 7))
    alone = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY).new_tokens for p in prompts]
    events, forwards, advance, step = [], [], PromptPrefill.advance, batching._Run.step

    def advanced(prefill, limit=None):
        encoded = advance(prefill, limit)
        events.append(encoded)
        forwards.append(prefill.length)
        return encoded

    def stepped(run, live, filling):
        out = step(run, live, filling)
        events.append("step" if live else "idle")
        return out

    monkeypatch.setattr(PromptPrefill, "advance", advanced)
    monkeypatch.setattr(batching._Run, "step", stepped)
    monkeypatch.setattr(target, "prefill_chunk", 4)
    done, _, _, _ = run_batch(target, "ar", prompts, batch=3)
    assert [done[i].new_tokens for i in range(4)] == alone
    assert most_positions_between_steps(events) == 4
    assert forwards.count(40) >= 10  # the long prompt in forwards of at most 4, spread over gaps
    steps_between = [e for e in events[events.index(4) :] if e == "step"]
    assert len(steps_between) >= 9


def test_the_stall_check_sees_a_whole_prompt_between_two_steps():
    assert most_positions_between_steps([4, "step", 4, 4, 4, "step", "step"]) == 12
    assert most_positions_between_steps([9, "step", 1, 3, "step", "idle", 4, 4, "step"]) == 4


def test_the_equality_table_tool_refuses_bad_sizes_and_methods(capsys):
    """graft-bench batch-lossless: bad input is one line naming the value and what is allowed."""
    from graft.bench import batch_lossless
    from graft.schema import ConfigError

    with pytest.raises(ConfigError, match="--sizes 0,4 is not allowed"):
        batch_lossless.main(["--sizes", "0,4"])
    with pytest.raises(ConfigError, match="--methods nope: no such method"):
        batch_lossless.main(["--models", "tiny_llama", "--methods", "ar,nope", "--sizes", "1"])


def test_the_equality_table_tool_prints_one_cell_per_batch_size(capsys):
    from graft.bench import batch_lossless

    batch_lossless.main(["--models", "tiny_llama", "--methods", "pld", "--sizes", "1,3", "--new-tokens", "6"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[-1] == "| tiny_llama | pld | 8/8 equal | 8/8 equal |"


def test_the_throughput_bench_splits_a_streams_forwards_into_decode_and_prompt_rows(capsys, monkeypatch):
    """graft-bench batch --forwards on tiny_llama, 8 prompts at concurrency 2, 6 new tokens each (EOS ignored):
    the sequences start and end in pairs, so each pair's two prompts run in one forward with nothing decoding,
    then 5 decode-only steps follow; every prompt position is counted once."""
    from graft.bench import batch

    streams = []
    stream_prompts = batch.Loaded.stream_prompts
    monkeypatch.setattr(
        batch.Loaded, "stream_prompts", lambda self, size: streams.append(stream_prompts(self, size)) or streams[-1]
    )
    batch.main(["--model", "tiny_llama", "--sizes", "2", "--rounds", "1", "--new-tokens", "6", "--forwards"])
    row = capsys.readouterr().out.splitlines()[-1].strip("| ").split(" | ")
    assert row[0] == "engine, B = 2"
    decode, prompt, rows = int(row[2]), int(row[5]), int(row[6])
    assert (decode, prompt, rows) == (4 * 5, 4, sum(len(p) for p in streams[-1]))


def positions_per_node(steps: list[dict]) -> float:
    """Positions a batch's verify forwards computed per real tree node (padding and padding rows included)."""
    decoding = [step for step in steps if step["slots"]]
    return sum(step["positions"] for step in decoding) / sum(step["nodes"] for step in decoding)


def test_on_the_engine_a_step_computes_only_real_nodes(tiny):
    """Ragged rows at B = 8: every method's forwards compute its trees' nodes and nothing else (at most 1.05
    positions per node); the padded transformers path computes more for pld's trees of varying size (the check's
    negative control)."""
    engine = tiny("tiny_llama:packed").target
    prompts = _prompts(engine.vocab_size, lengths=(5, 17, 9, 30, 12, 7, 21, 11, 6, 14))
    for method in group_options("method"):
        _, _, steps, _ = run_batch(engine, method, prompts, batch=8)
        assert positions_per_node(steps) <= 1.05, method
    plain = tiny("tiny_llama").target
    _, _, steps, _ = run_batch(plain, "pld", prompts, batch=8)
    assert positions_per_node(steps) > 1.05


def test_on_the_engine_newcomers_prompts_ride_in_the_steps_one_chunk_a_step(tiny, monkeypatch):
    """hardware.prefill_chunk=4 on the engine: no prefill forward runs between two steps while sequences decode;
    the newcomers' chunks ride in the steps' forwards, at most 4 prompt positions a step, so a 40-token prompt is
    spread over at least 10 steps; every sequence decodes AR's tokens; leavers free slots for newcomers."""
    from graft.backends.target import PromptPrefill

    target = tiny("tiny_llama:packed").target
    prompts = _prompts(target.vocab_size, lengths=(5, 6, 40, 7, 9))
    alone = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY).new_tokens for p in prompts]
    separate = []
    monkeypatch.setattr(PromptPrefill, "advance", lambda *a, **k: separate.append(1))
    monkeypatch.setattr(target, "prefill_chunk", 4)
    done, slots, steps, _ = run_batch(target, "ar", prompts, batch=3)
    assert [done[i].new_tokens for i in range(5)] == alone
    assert not separate  # no prompt encoded in a forward of its own
    decoding = [step for step in steps if step["slots"]]
    assert max(step["prefill"] for step in decoding) == 4
    assert sum(1 for step in decoding if step["prefill"]) >= 10
    assert len(set(slots.values())) == 3 and len(done) == 5


def test_occupancy_leaves_out_the_ramp_up_and_the_drain():
    from graft.batch import occupancy

    steps = [{"slots": s, "queued": q} for s, q in (([0], 5), ([0, 1], 4), ([0, 1, 2], 3), ([0, 1, 2], 1))]
    steps += [{"slots": [0, 1], "queued": 0}, {"slots": [0], "queued": 0}, {"slots": [], "queued": 0}]
    found = occupancy(steps, 3)
    assert found["steady"] == 3.0 and found["steady_steps"] == 2
    assert found["mean"] == 12 / 6


def _head_rows_calls(target, monkeypatch, method: str, summary=None) -> tuple[list, dict, list]:
    calls = []
    drafters = [make_drafter(method, target) for _ in range(4)]
    for drafter in drafters:
        layer = drafter.source.runner.head.engine
        monkeypatch.setattr(layer, "module", _Recording(layer.module, "head_rows", 3, calls, summary))
    for other in drafters[1:]:
        other.share_with(drafters[0])
    prompts = _prompts(target.vocab_size, lengths=(5, 9, 7, 11))
    done = {}
    queue = deque(BatchRequest(ids, tag=i) for i, ids in enumerate(prompts))
    capacity = slot_capacity([len(p) for p in prompts], MAX_NEW, drafters[0].max_nodes())
    generate_batch(target, drafters, queue, MAX_NEW, set(), GREEDY, capacity, lambda r, g, s: done.update({r.tag: g}))
    return calls, done, prompts


# graft_noprune: Graft's tree without the confidence stage, which stops a random head's tree at its root
@pytest.mark.parametrize("method", ["eagle3", "graft_noprune"])
def test_a_batch_drafts_each_eagle_level_in_one_head_forward_for_every_slot(tiny, monkeypatch, method):
    """On the engine the slots draft in lockstep: each tree level is one head_rows forward over every live slot's
    frontier (four slots: calls of four segments), and every sequence still decodes AR's tokens. Negative control:
    slots that do not share their head's weights cannot batch it (no head_rows call at all)."""
    target = tiny("tiny_llama:packed").target
    calls, done, prompts = _head_rows_calls(target, monkeypatch, method)
    alone = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY).new_tokens for p in prompts]
    assert [done[i].new_tokens for i in range(4)] == alone
    assert calls and max(calls) == 4 and min(calls) >= 2
    from graft.methods.eagle3 import _HeadSource

    monkeypatch.setattr(_HeadSource, "share_with", lambda self, first: None)
    unshared, _, _ = _head_rows_calls(target, monkeypatch, method)
    assert unshared == []


def test_a_batch_extends_every_slots_eagle_head_in_one_head_forward(tiny, monkeypatch):
    """After a verification the slots' heads encode their accepted tokens in lockstep (Drafter.update_steps): one
    head_rows forward over every slot's extend (causal segments: no masks), and the tokens stay AR's."""
    target = tiny("tiny_llama:packed").target

    def extends(args) -> int:  # segments in a head_rows call whose every segment is causal (an extend)
        return len(args[3]) if all(mask.numel() == 0 for mask in args[7]) else 0

    calls, done, prompts = _head_rows_calls(target, monkeypatch, "eagle3", extends)
    alone = [generate(target, make_drafter("ar", target), p, MAX_NEW, set(), GREEDY).new_tokens for p in prompts]
    assert [done[i].new_tokens for i in range(4)] == alone
    assert max(calls) == 4 and sum(1 for c in calls if c >= 2) >= 3, calls


def test_the_ops_tool_counts_ops_padding_and_reads_of_a_batched_step(capsys):
    """graft-bench batch-ops: one row per method and batch size; on the engine no position is padding, and a
    batch of 2 dispatches more ATen ops per step than a batch of 1 (the per-slot work it still has)."""
    from graft.bench import batch_ops

    batch_ops.main(["--methods", "ar", "--sizes", "1,2"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ar")]
    assert [r[1].strip() for r in rows] == ["1", "2"]
    assert all(r[4].strip() == "1.00" for r in rows)
    assert float(rows[1][3].strip().rstrip("x")) > 1.0
