"""hardware.compile: static caches, and the verify forward and draft-head levels through torch.compile."""

import contextlib
import json

import pytest
import torch
from conftest import compose, make_drafter

from baselines.autoregressive import Autoregressive
from graft.config.experiment import validate
from graft.data.loading import BUILTIN
from graft.decode import generate
from graft.kv import KVBuffer
from graft.schema import ConfigError

pytestmark = pytest.mark.slow  # torch.compile on every path (about 75 s): `make test-fast` leaves it out


def _kv(*values: float) -> torch.Tensor:
    return torch.tensor(values).view(1, 1, len(values), 1)  # [b, h, n, d]


def test_a_static_buffer_writes_at_its_device_position_and_returns_every_slot():
    buf = KVBuffer(5, static=True)
    keys, values = buf.append(_kv(1, 2), _kv(11, 12))
    assert keys.shape[2] == 5 and buf.length == 0  # the host length moves with advance(), outside any graph
    buf.advance(2)
    keys, _ = buf.append(_kv(3, 4), _kv(13, 14))  # a two-node tree after the two committed positions
    buf.advance(2)
    assert keys[0, 0, :, 0].tolist() == [1, 2, 3, 4, 0] and buf.length == 4
    buf.keep(2, torch.tensor([1]), 1)  # the path took the tree's second node
    assert buf.length == 3 and int(buf.write_at) == 3
    assert buf.keys[0, 0, :3, 0].tolist() == [1, 2, 4] and buf.values[0, 0, :3, 0].tolist() == [11, 12, 14]
    keys, _ = buf.append(_kv(5), _kv(15))
    assert keys[0, 0, 3, 0] == 5
    buf.advance(1)
    buf.reserve(9)  # grown outside a forward; filled slots kept, the rest zero
    assert buf.capacity >= 9 and buf.keys[0, 0, :, 0].tolist()[:5] == [1, 2, 4, 5, 0]


def test_compile_with_a_fast_path_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="hardware.compile='default'.*fast_path"):
        validate(compose(["model=tiny_llama", "hardware=cpu", "hardware.compile=default"]))


def _prompt_of(model, prompt):
    return model.chat.prompt_ids([{"role": "user", "content": prompt.turns[0]}])


def _prompt(model, k=0):
    return model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])


@contextlib.contextmanager
def _compiled(tiny, name, backend):
    """The shared tiny model (tests/conftest.py caches it) with hardware.compile on, restored afterwards."""
    model = tiny(name)
    target = model.target
    target.fixed_size_trees, target.compile_mode, target.compile_backend = True, "default", backend
    try:
        yield model
    finally:
        target.fixed_size_trees, target.compile_mode, target.compile_backend, target._compiled = (
            False,
            None,
            "inductor",
            None,
        )
        target.reset(8)  # a fresh growing cache, not the static one


@pytest.mark.parametrize(
    "name, methods", [("tiny_llama", ["ar", "eagle3", "pruned", "graft", "recycling"]), ("tiny_qwen3_moe", ["graft"])]
)
def test_compiled_steps_over_static_caches_are_lossless(tiny, name, methods):
    """The graphs torch.compile captures over static caches (backend "eager": captured by dynamo, run by
    eager kernels) give the eager baseline's tokens for the methods with fixed-size trees."""
    eager = tiny(name)
    ids = _prompt(eager)
    base = generate(eager.target, Autoregressive(eager.target), ids, 24, eager.stop_ids)
    with _compiled(tiny, name, "eager") as model:
        target = model.target
        for method in methods:
            drafter = Autoregressive(target) if method == "ar" else make_drafter(method, target)
            out = generate(target, drafter, ids, 24, model.stop_ids)
            assert out.new_tokens == base.new_tokens, f"compiled {method} on {name}"
            assert target.cache.static and target.cache.capacity == target.cache.layers[0].keys.shape[2]
        assert target._compiled is not None, "the verify forward never went through torch.compile"


@pytest.mark.parametrize("method, backend", [("eagle3", "inductor"), ("graft", "eager")])
def test_after_the_warm_up_prompts_of_three_lengths_compile_nothing(tiny, method, backend):
    """Over static caches sized in buckets the runner's warm-up compiles every bucket the run's prompts reach,
    then prompts of three lengths (two buckets) run without a new graph, lossless, and later sequences reuse
    the cache buffers of their bucket. eagle3 with inductor's kernels; graft, whose pruned trees are verified
    at any multiple of hardware.tree_bucket (a graph each: 8, 16, 24 here), with dynamo's capture alone, to
    keep it quick."""
    from types import SimpleNamespace

    from graft.backends.compiling import capacity_bucket, compiled_graphs
    from graft.data.loading import Prompt
    from graft.decode import SamplingConfig
    from graft.run.warmup import WarmUp, tree_sizes

    eager = tiny("tiny_llama")
    texts = ["Hi.", BUILTIN[1].turns[0], BUILTIN[1].turns[0] * 12]
    prompts = [Prompt(id=str(i), turns=[t], category="test") for i, t in enumerate(texts)]
    lengths = [len(_prompt_of(eager, p)) for p in prompts]
    run_cfg = SimpleNamespace(max_new_tokens=12, warmup_tokens=4)
    bases = [
        generate(eager.target, Autoregressive(eager.target), _prompt_of(eager, p), 12, eager.stop_ids) for p in prompts
    ]
    torch._dynamo.reset()  # graphs of earlier tests would hide this one's
    with _compiled(tiny, "tiny_llama", backend) as model:
        drafter = make_drafter(method, model.target, **({"total_tokens": 24} if method == "graft" else {}))
        warm = WarmUp(model, [drafter], run_cfg, SamplingConfig())
        warm.start(prompts)
        graphs = compiled_graphs()
        for prompt, base in zip(prompts, bases):
            out = generate(model.target, drafter, _prompt_of(model, prompt), 12, model.stop_ids)
            assert out.new_tokens == base.new_tokens, prompt.id
        buffer = model.target.cache.layers[0].keys
        generate(model.target, drafter, _prompt_of(model, prompts[-1]), 12, model.stop_ids)
        assert model.target.cache.layers[0].keys is buffer  # the same bucket: the same buffers
        nodes, sizes = drafter.max_nodes(), tree_sizes(drafter)
    assert len({capacity_bucket(n + 12 + nodes + 8) for n in lengths}) == 2, lengths
    assert (len(sizes) > 1) == (method == "graft"), sizes
    assert warm.counts["graphs"] > 0 and compiled_graphs() == graphs, warm.counts


def test_bench_compile_reports_both_backends_and_equal_tokens(tmp_path):
    import json
    import subprocess
    import sys

    from conftest import ROOT

    out = tmp_path / "bench.json"
    argv = ["--model", "tiny_llama", "--backend", "eager", "--nodes", "1,4", "--context", "16", "--repeats", "1"]
    argv += ["--prompts", "1", "--max-new", "8", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "graft.bench", "compile", *argv], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["verify_median_ms"]) == {"eager", "compiled"} and set(report["eager_over_compiled"]) == {"1", "4"}
    assert all(row["equal_tokens"] for row in report["decode"].values()), report["decode"]


TWO_TURNS = ("Tell me about the sea. " * 6, "Now say it again, shorter and in other words. " * 6)


def _two_turn_run(tmp_path, backend: str) -> tuple[dict, list[dict]]:
    """A run of ar against recycling (80-node fixed-size trees) on one two-turn prompt with hardware.compile on:
    the first turn lands in the 512-position bucket, the second (the first, its answer, then the question) in
    640 -> (run.json's compile, samples)."""
    import json

    from graft.run.runner import run

    data = tmp_path / "question.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "test", "turns": list(TWO_TURNS)}) + "\n")
    overrides = ["model=tiny_llama", "methods=[recycling]", "dataset=mt_bench", f"dataset.path={data}"]
    overrides += ["hardware.fast_path=none", "hardware.fixed_size_trees=true", "hardware.compile=default"]
    overrides += [f"hardware.compile_backend={backend}", "run.max_new_tokens=8", "run.warmup_tokens=4"]
    resolved = compose([*overrides, "logger=none", "run.progress=false"])
    resolved["run"]["out_dir"] = str(tmp_path / "out")
    run(validate(resolved), resolved)
    out = tmp_path / "out"
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return json.loads((out / "run.json").read_text())["compile"], samples


def _turn_buckets(sample: dict) -> list[int]:
    from graft.backends.compiling import capacity_bucket

    turns = [t["prompt_tokens"] for t in sample["baseline"]["turns"]]
    return [capacity_bucket(n + 8 + 80 + 8) for n in turns]  # max_new_tokens, recycling's 80 nodes, decode's 8


@pytest.fixture
def fresh_dynamo():
    """Graphs compiled by an earlier test would hide this one's compiles; the tiny model is the suite's own."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_two_turn_run_compiles_nothing_inside_timed_runs(tmp_path, fresh_dynamo):
    """CPU inductor: the warm-up runs ar and recycling in both buckets the turns reach (the second turn's
    from turn_spans), both sized for recycling's trees, and the timed turns compile no graph."""
    info, (sample,) = _two_turn_run(tmp_path, "inductor")
    assert _turn_buckets(sample) == [512, 640], sample["baseline"]["turns"]
    assert info["cache_buckets"] == [512, 640] and info["late_buckets"] == [], info
    assert info["graphs_at_warmup"] > 0 and info["graphs_timed"] == 0, info
    assert info["cudagraph_records_timed"] is None and info["cudagraphs"].startswith("none"), info  # a CPU
    assert sample["methods"]["recycling"]["lossless"]["equal"]


@pytest.mark.parametrize("guard", [False, True])
def test_a_warm_up_of_first_turns_only_is_caught_or_mended_by_the_guard(tmp_path, fresh_dynamo, monkeypatch, guard):
    """The negative control of the test above (dynamo's own capture, backend "eager", to keep it quick): a
    warm-up of first turns only, as before this change, leaves the second turn's graphs to a timed run and
    run.json counts them; with the guard before each timed turn, the missed bucket is warmed there, untimed,
    and named."""
    from graft.run import warmup

    first_turns = warmup.turn_spans
    monkeypatch.setattr(warmup, "turn_spans", lambda *args: first_turns(*args)[:1])
    if not guard:
        monkeypatch.setattr(warmup.WarmUp, "before_turn", lambda self, ids: None)
    info, (sample,) = _two_turn_run(tmp_path, "eager")
    assert _turn_buckets(sample) == [512, 640]
    if guard:
        assert info["late_buckets"] == [640] and info["graphs_timed"] == 0, info
    else:
        assert info["cache_buckets"] == [512] and info["graphs_timed"] > 0, info


def test_every_drafter_of_a_run_shares_the_largest_drafters_bucket(tiny):
    """AR (one node) and graft (60 nodes) on one prompt whose AR capacity and graft capacity fall in different
    buckets: sized for the larger, they share one static cache buffer."""
    from graft.run.conversation import sized_for_largest

    with _compiled(tiny, "tiny_llama", "eager") as model:
        target = model.target
        ar, graft = Autoregressive(target), make_drafter("graft", target)
        largest = max(ar.max_nodes(), graft.max_nodes())
        ids = _prompt(model) * 40
        ids = ids[: 512 - 8 - 8 - ar.max_nodes() - 1]  # AR alone would fit 512; graft needs the next bucket
        buffers = []
        for drafter in (ar, graft, ar):
            with sized_for_largest(target, drafter, largest):
                generate(target, drafter, ids, 8, model.stop_ids)
            buffers.append(target.cache.layers[0].keys)
        assert target.spare_nodes == 0 and target.cache.capacity == 640
        assert buffers[0] is buffers[1] is buffers[2]


def _batch_tokens(target, drafters, prompts: list[list[int]], new: int) -> dict:
    from collections import deque

    from graft.batch import BatchRequest, generate_batch, slot_capacity
    from graft.decode import SamplingConfig

    done: dict = {}
    queue = deque(BatchRequest(p, None, tag=i) for i, p in enumerate(prompts))
    capacity = slot_capacity([len(p) for p in prompts], new, max(d.max_nodes() for d in drafters))
    record = lambda request, gen, slot: done.__setitem__(request.tag, gen.new_tokens)  # noqa: E731
    generate_batch(target, drafters, queue, new, set(), SamplingConfig(), capacity, record)
    return done


def _rows_at_host_starts(self, first: int, starts: torch.Tensor):
    """SlotCaches.rows as it was: each row's keys written at its start held as a host integer."""
    from graft.backends.slots import RowsKVCache, RowsKVLayer

    class HostStarts(RowsKVLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            for row, start in enumerate(self.host_starts):
                self.keys[row, :, start : start + n] = key_states[row]
                self.values[row, :, start : start + n] = value_states[row]
            return self.keys, self.values

    span, host = slice(first, first + starts.shape[0]), starts.tolist()
    layers = [HostStarts(k[span], v[span], starts) for k, v in zip(self.keys, self.values)]
    for layer in layers:
        layer.host_starts = host
    return RowsKVCache(layers)


def test_a_compiled_batch_captures_a_graph_per_rows_bucket_and_none_for_new_starts(monkeypatch):
    """Graft at B = 4 compiled (the GPU settings on the CPU: fixed-size trees, tree_bucket 0; dynamo's capture
    with the eager backend): a warm-up stream of 6 prompts over 4 slots reaches the rows buckets 4, 2 and 1; a
    second stream of other prompts (other slot starts, newcomers and leavers) captures no new graph, and every
    sequence's tokens are batch-1 AR's. Negative control: the rows' starts as host integers, written row by row
    (as the cache did before the starts moved to the device), make new starts new graphs."""
    from test_host_syncs import drafter_for, gpu_settings

    from graft.backends import slots
    from graft.backends.compiling import compiled_graphs

    target = gpu_settings("tiny_llama")
    target.tree_bucket, target.compile_mode, target.compile_backend = 0, "default", "eager"
    generator = torch.Generator().manual_seed(5)
    streams = [
        [torch.randint(3, 200, (n,), generator=generator).tolist() for n in lengths]
        for lengths in ((12, 21, 9, 17, 10, 26), (15, 8, 23, 11, 19, 13))
    ]
    alone = [generate(target, drafter_for("ar", target), p, 8, set()).new_tokens for p in streams[1]]
    drafters = [drafter_for("graft", target) for _ in range(4)]
    torch._dynamo.reset()
    _batch_tokens(target, drafters, streams[0], 8)
    graphs = compiled_graphs()
    done = _batch_tokens(target, drafters, streams[1], 8)
    assert 0 < graphs == compiled_graphs()
    assert [done[i] for i in range(6)] == alone
    monkeypatch.setattr(slots.SlotCaches, "rows", _rows_at_host_starts)
    torch._dynamo.reset()
    target._compiled = None
    _batch_tokens(target, drafters, streams[0], 8)
    graphs = compiled_graphs()
    _batch_tokens(target, drafters, streams[1], 8)
    assert compiled_graphs() > graphs


def _compiled_batched_run(path, *extra) -> dict:
    from graft.config.experiment import validate
    from graft.run import runner

    overrides = ["model=tiny_llama", "methods=[graft]", "run.batch_size=2", "run.num_prompts=4"]
    overrides += ["run.max_new_tokens=8", "logger=none", "run.progress=false", "hardware=gpu", "hardware.device=cpu"]
    overrides += ["hardware.fast_path=none", "hardware.compile=default", "hardware.compile_backend=eager", *extra]
    resolved = compose(overrides)
    resolved["run"]["out_dir"] = str(path)
    runner.run(validate(resolved), resolved)
    return json.loads((path / "summary.json").read_text())


def test_a_compiled_batched_run_compiles_every_graph_at_its_warm_up(tmp_path, monkeypatch):
    """Graft at run.batch_size=2 with hardware.compile (the GPU settings on the CPU, dynamo's capture): the warm-up
    covers every rows bucket at every slot capacity the streams reach, so no graph compiles inside a timed
    stream (run.json's compile.graphs_timed 0), and every method is lossless. Negative control: a warm-up run
    eager compiles no bucket, and the timed streams count the graphs they compile."""
    from graft.run import batched

    torch._dynamo.reset()
    summary = _compiled_batched_run(tmp_path / "warm")
    assert summary["compile"]["graphs_at_warmup"] > 0 and summary["compile"]["graphs_timed"] == 0, summary["compile"]
    assert all(side["lossless"] for side in summary["methods"].values())
    warm = batched.warm_batches

    def roles_alone(model, slot_drafters, groups, run_cfg, sampling):
        compile_mode, model.target.compile_mode = model.target.compile_mode, None  # nothing compiled
        try:
            warm(model, slot_drafters, groups, run_cfg, sampling)
        finally:
            model.target.compile_mode = compile_mode

    monkeypatch.setattr(batched, "warm_batches", roles_alone)
    torch._dynamo.reset()
    assert _compiled_batched_run(tmp_path / "cold")["compile"]["graphs_timed"] > 0
