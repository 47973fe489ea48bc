"""The cost model on literal numbers: interpolation in the profile's table, a hand-computed projection, and
project_speedup.py on a hand-written run directory."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, finish_run

from graft.budget.profile import CostProfile, interpolate
from graft.costmodel.project import Step, job_anchor, project, turn_steps


def _profile(**changes) -> CostProfile:
    """verify(1) = 30 ms, verify(8) = 45 ms at context 256; 40 and 65 ms at context 1024; overhead 1 ms."""
    fields = dict(
        device="test CPU",
        model="m",
        nodes=[1, 8],
        contexts=[256, 1024],
        verify_table_ms=[[30.0, 45.0], [40.0, 65.0]],
        overhead_table_ms=[1.0, 1.0],
        draft_step_ms={"ar": 0.0, "graft": 2.0},
        meta={"measured_at": "2026-11-30T03:00Z"},
    )
    return CostProfile(**{**fields, **changes})


def test_interpolation_is_linear_inside_held_below_and_extrapolated_beyond():
    assert interpolate(4, [1, 8], [30.0, 44.0]) == pytest.approx(36.0)
    assert interpolate(0, [1, 8], [30.0, 44.0]) == 30.0
    assert interpolate(16, [1, 8, 16, 32], [1.0, 2.0, 4.0, 8.0]) == 4.0
    # beyond the last point the measured slope goes on (2 ms a node here): a larger tree is never free
    assert interpolate(200, [1, 8], [30.0, 44.0]) == pytest.approx(428.0)
    assert interpolate(48, [1, 8, 16, 32], [1.0, 2.0, 4.0, 8.0]) == pytest.approx(12.0)
    # a noisy last segment (43 after 44) cannot flatten it: the whole range's slope, 13 / 15 ms a node, is steeper
    assert interpolate(31, [1, 8, 16], [30.0, 44.0, 43.0]) == pytest.approx(56.0)
    assert interpolate(9, [1, 8], [30.0, 29.0]) == 29.0  # a falling measurement is held, never extrapolated down
    assert interpolate(9, [8], [29.0]) == 29.0  # one point: no slope to go on


def test_verify_ms_interpolates_in_nodes_then_in_context():
    profile = _profile()
    assert profile.verify_ms(1, 256) == 30.0
    assert profile.verify_ms(8, 1024) == 65.0
    assert profile.verify_ms(4.5, 256) == pytest.approx(37.5)  # halfway from 1 to 8 nodes
    assert profile.verify_ms(8, 640) == pytest.approx(55.0)  # halfway from 256 to 1024
    assert profile.verify_ms(4.5, 640) == pytest.approx(45.0)  # (37.5 at 256 + 52.5 at 1024) / 2
    assert profile.verify_ms(8, 64) == 45.0  # below the table: its first context
    # beyond the table, each measured slope goes on: 15 / 7 ms a node at 256, 25 / 7 at 1024: 60 and 90 ms at
    # 15 nodes, then 30 ms per 768 positions
    assert profile.verify_ms(15, 256) == pytest.approx(60.0)
    assert profile.verify_ms(15, 1024) == pytest.approx(90.0)
    assert profile.verify_ms(15, 1792) == pytest.approx(120.0)
    assert profile.verify_ms(8, 1792) == pytest.approx(85.0)  # 20 ms per 768 positions at 8 nodes


def test_a_profile_survives_its_json(tmp_path):
    profile = _profile(model_hash="abc", dtype="torch.float32", engine="HFBackend, compile off")
    profile.save(tmp_path / "p.json")
    assert CostProfile.load(tmp_path / "p.json") == profile
    with pytest.raises(ValueError):
        _profile(verify_table_ms=[[30.0, 45.0]])


@pytest.mark.parametrize(
    "text,reason",
    [
        ('{"device": "cpu", "model": "m", "nodes": [1, 8], "contexts": [25', "Expecting"),  # torn
        ("not json at all", "Expecting value"),
        ('{"device": "cpu", "model": "m", "nodes": [1, 8], "contexts": [256]}', "verify_table_ms"),  # incomplete
        ('{"device": "cpu", "model": "m", "contexts": [256]}', "no field 'nodes'"),
        (
            '{"device": "cpu", "model": "m", "nodes": [1, 8], "contexts": [256], "verify_table_ms": [[30.0, NaN]], '
            '"overhead_table_ms": [1.0, 1.0]}',
            "verify_table_ms[0][1]=nan: expected a finite number of ms > 0",
        ),
        (
            '{"device": "cpu", "model": "m", "nodes": [1, 8.5], "contexts": [256], "verify_table_ms": [[30.0, 40.0]], '
            '"overhead_table_ms": [1.0, -1.0]}',
            "nodes[1]=8.5: expected a whole number >= 1",
        ),
        ("[1, 2]", "a JSON list, not an object"),
    ],
)
def test_a_file_that_is_not_a_profile_is_a_one_line_config_error_naming_it(tmp_path, text, reason):
    from graft.schema import ConfigError

    path = tmp_path / "torn.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        CostProfile.load(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path} is not a cost profile") and reason in message


def test_project_matches_a_hand_computed_case():
    # draft 5 + verify(8) 45 + overhead 1 = 51 ms a step, 6 tokens in 3 steps: 25.5 ms a token;
    # AR: verify(1) 30 + overhead 1 = 31 ms a token -> 31 / 25.5
    steps = [Step(accepted=a, nodes=8, context=100, draft_ms=5.0) for a in (3, 1, 2)]
    result = project(steps, _profile())
    assert result["kind"] == "projection"
    assert result["ms_per_token"] == pytest.approx(25.5)
    assert result["baseline_ms_per_token"] == pytest.approx(31.0)
    assert result["speedup"] == pytest.approx(31 / 25.5)
    assert round(result["speedup"], 4) == 1.2157
    assert result["tau"] == 2.0 and result["draft"] == "measured"
    rows = [{"accepted": a, "nodes": 8, "context": 100, "draft_ms": 5.0} for a in (3, 1, 2)]  # plain rows do too
    assert project(rows, _profile())["speedup"] == pytest.approx(31 / 25.5)
    # the profile's draft cost instead of the recorded one: (2 + 45 + 1) * 3 / 6 = 24 ms a token
    assert project(steps, _profile(), draft_ms=_profile().draft_ms("graft"))["ms_per_token"] == pytest.approx(24.0)


def test_a_tree_step_that_accepts_moves_its_path():
    # 2 ms to move a path: only for steps of 3+ nodes that committed 2+ tokens (a chain of 2 stays in place)
    profile = _profile(commit_move_ms=2.0)
    assert profile.overhead_ms(8, accepted=1) == 1.0
    assert profile.overhead_ms(8, accepted=3) == 3.0
    assert profile.overhead_ms(2, accepted=2) == 1.0
    steps = [Step(accepted=a, nodes=8, context=100, draft_ms=5.0) for a in (3, 1, 2)]
    assert project(steps, profile)["ms_per_token"] == pytest.approx((3 * 51 + 2 * 2) / 6)


def test_a_job_anchor_scales_the_profile_by_its_own_baseline():
    # the job's AR steps recorded 40 + 2.5 ms at context 256 where the profile says 30 + 1: 1.3710x slower
    ar_steps = [Step(1, 1, 256, 0.0, verify_ms=40.0, other_ms=2.5) for _ in range(4)]
    factor = job_anchor(ar_steps, _profile())
    assert factor == pytest.approx(42.5 / 31)
    scaled = _profile().scaled(factor)
    assert scaled.verify_ms(8, 1024) == pytest.approx(65.0 * factor) and scaled.overhead_ms(8) == pytest.approx(factor)
    # the speedup of a method keeps the profile's shape: (31 / 25.5) before, 1 ms of draft less scaled now
    steps = [Step(accepted=a, nodes=8, context=100, draft_ms=5.0) for a in (3, 1, 2)]
    expected = (31 * factor) / ((5 + 46 * factor) * 3 / 6)
    assert project(steps, scaled)["speedup"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="no recorded verify"):
        job_anchor([Step(1, 1, 256, 0.0)], _profile())


def test_the_baseline_pays_each_tokens_own_context():
    # verify(1) is 30 ms at context 256 and 40 ms at 1024: 35 ms at 640, 40 ms at 1024
    assert project([Step(1, 8, 640, 0.0)], _profile())["baseline_ms_per_token"] == pytest.approx(35.0 + 1.0)
    # a step committing 2 tokens at context 1023 stands for AR steps at 1023 and 1024
    expected = (_profile().verify_ms(1, 1023) + 40.0) / 2 + 1.0
    assert project([Step(2, 8, 1023, 0.0)], _profile())["baseline_ms_per_token"] == pytest.approx(expected)


def test_turn_steps_rebuild_the_context_from_the_prompt_and_earlier_steps():
    turn = {"prompt_tokens": 50, "accept_lengths": [3, 1, 2], "nodes": [8, 8, 4], "draft_ms": [5.0, 5.0, 4.0]}
    turn.update(verify_ms=[40.0, 41.0, 35.0], other_ms=[1.0, 1.0, 0.5])
    steps = turn_steps(turn)
    assert [s.context for s in steps] == [50, 53, 54]
    assert [(s.nodes, s.draft_ms, s.verify_ms) for s in steps] == [(8, 5.0, 40.0), (8, 5.0, 41.0), (4, 4.0, 35.0)]


def _run_dir(path, batch: dict | None = None):
    """A comparison run directory: graft's one turn accepts [3, 1, 2] with 8 nodes and 5 ms of draft (with
    `batch`, summary.json's `batch` of a run at run.batch_size > 1)."""
    path.mkdir(parents=True)
    method_config = {"total_tokens": 8, "thresholds": [0.5, 0.25]}

    def turn(accepted, nodes, draft):
        n = len(accepted)
        return {
            "prompt_tokens": 100,
            "steps": n,
            "accept_lengths": accepted,
            "nodes": [nodes] * n,
            "draft_ms": [draft] * n,
            "verify_ms": [40.0] * n,
            "other_ms": [1.0] * n,
        }

    graft = {"dataset": "mt", "method": "graft", "speedup_decode": 1.25, "method_config": method_config}
    summary = {
        "kind": "comparison",
        "model": "m",
        "dataset": "mt",
        "method": "compare",
        "rows": {"ar": {"speedup_decode": 1.0}, "graft": {"speedup_decode": 1.25}},
        "methods": {"graft": graft},
    }
    if batch is not None:
        summary["batch"] = batch
    record = {
        "id": "p1",
        "status": "ok",
        "baseline": {"turns": [turn([1] * 6, 1, 0.0)]},
        "methods": {"graft": {"side": {"turns": [turn([3, 1, 2], 8, 5.0)]}}},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "run.json").write_text(json.dumps({"config_hash": "x"}))
    (path / "samples.jsonl").write_text(json.dumps(record) + "\n")
    finish_run(path)


@pytest.mark.parametrize("budgets", [False, True])
def test_project_speedup_prints_the_projection_beside_the_measurement(tmp_path, budgets):
    _run_dir(tmp_path / "runs" / "b8")
    _profile().save(tmp_path / "profile.json")
    out = tmp_path / "table.md"
    command = [sys.executable, "-m", "graft.costmodel", "project", str(tmp_path / "runs"), "--profile"]
    command += [str(tmp_path / "profile.json"), "--out", str(out)] + (["--budgets"] if budgets else [])
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"Every projected number is a projection from {tmp_path / 'profile.json'}")
    assert "measured on test CPU" in first
    if budgets:
        row = next(line for line in proc.stdout.splitlines() if line.startswith("| 8 |"))
        assert "| 0.5/0.25 | 1.22x (1.25x) |" in row
    else:
        row = next(line for line in proc.stdout.splitlines() if line.startswith("| mt | graft"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells == ["mt", "graft", "8", "2.00", "8.0", "1.25x", "1.22x", "-2.7%"]  # 1.2157 / 1.25 - 1
    assert "1 of 1 projections within 10%" in proc.stdout
    assert out.read_text() == proc.stdout


def _batch_profile() -> CostProfile:
    """At batch 8: one forward of 8 trees is 80 ms at 1 node and 240 ms at 8 (context 256); a sequence's share
    10 and 30 ms. Overhead 1 ms a sequence."""
    return _profile(batch=8, verify_table_ms=[[80.0, 240.0], [120.0, 400.0]])


def test_a_batched_profile_keeps_its_batch_and_a_sequence_pays_its_share(tmp_path):
    profile = _batch_profile()
    profile.save(tmp_path / "b8.json")
    assert CostProfile.load(tmp_path / "b8.json") == profile and profile.verify_share_ms(8, 256) == 30.0
    _profile().save(tmp_path / "b1.json")  # batch 1 writes the JSON it always did, and such a file reads as batch 1
    assert "batch" not in json.loads((tmp_path / "b1.json").read_text())
    assert CostProfile.load(tmp_path / "b1.json").batch == 1
    assert CostProfile.from_json({**profile.to_json(), "batch": 8.0}).batch == 8
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"batch={bad!r}: expected a whole number >= 1"):
            _profile(batch=bad)


def test_a_batch_1_run_projects_to_batch_8_by_hand(tmp_path):
    # a sequence's step: draft 5 + verify of 8 trees of 8 nodes / 8 = 30 + overhead 1 = 36 ms, 6 tokens in 3
    # steps: 18 ms a token; batched AR: 80 / 8 + 1 = 11 ms a token -> 11 / 18 = 0.611x (at batch 1 the same
    # tables would give 81 / 123 = 0.659x)
    steps = [Step(accepted=a, nodes=8, context=100, draft_ms=5.0) for a in (3, 1, 2)]
    result = project(steps, _batch_profile())
    assert result["batch"] == 8 and result["verify_ms_per_step"] == 30.0
    assert result["ms_per_token"] == pytest.approx(18.0) and result["baseline_ms_per_token"] == pytest.approx(11.0)
    assert result["speedup"] == pytest.approx(11 / 18)
    # the command: a batch-1 run has nothing measured at 8; a run recorded at 8 is compared with its decode
    # throughput over batched AR's (30 / 50 tokens/s: 0.60x; 0.6111 / 0.60 - 1 = +1.9%)
    _run_dir(tmp_path / "runs" / "a_batch1")
    roles = {"graft": {"throughput_decode_tokens_per_s": 30.0}, "baseline": {"throughput_decode_tokens_per_s": 50.0}}
    _run_dir(tmp_path / "runs" / "b_batch8", batch={"batch_size": 8, "groups": 1, "roles": roles})
    _batch_profile().save(tmp_path / "b8.json")
    command = [sys.executable, "-m", "graft.costmodel", "project", str(tmp_path / "runs"), "--profile"]
    proc = subprocess.run(command + [str(tmp_path / "b8.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"Every projected number is a projection at batch 8 from {tmp_path / 'b8.json'}")
    assert "| projected at batch 8 |" in proc.stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| mt | graft")]
    assert rows == [
        ["mt", "graft", "8", "2.00", "8.0", "-", "0.61x", "-"],
        ["mt", "graft", "8", "2.00", "8.0", "0.60x", "0.61x", "+1.9%"],
    ]
    assert "1 of 1 projections within 10%" in proc.stdout
    anchored = subprocess.run(
        command + [str(tmp_path / "b8.json"), "--anchor", "job"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert anchored.returncode == 2 and "measured at batch 8: use --anchor profile" in anchored.stderr


# --- costs where the run is: a sharded target, a mixture-of-experts target -------------------------------


class FakeStream:
    def __init__(self, device):
        self.device = torch.device(device)


class ShardedStub:
    """A target whose layers span cuda:0..3 and whose LM head sits on cuda:3; no weights, no GPU."""

    devices = [torch.device(f"cuda:{i}") for i in range(4)]
    device = torch.device("cuda:3")
    vocab_size = 100

    class Cache:
        def keep(self, *args):
            pass

    def reset(self, capacity):
        self.cache = self.Cache()

    def prefill(self, ids):
        self.cache_len = len(ids)

    def verify(self, tree, topo):
        self.log.append(("verify", None))


def test_the_profile_syncs_every_device_and_times_on_the_lm_heads(monkeypatch):
    """On 4 GPUs, synchronising and timing cuda:0 alone sees about a quarter of a sharded verify."""
    from graft.budget import measure

    target, log = ShardedStub(), []
    target.log = log

    class FakeEvent:
        def __init__(self, enable_timing=False):
            pass

        def record(self, stream=None):
            log.append(("record", None if stream is None else stream.device))

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 2.5

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream(device))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(measure, "chain_tree", lambda *args: SimpleNamespace(parents=None))
    monkeypatch.setattr(measure, "topology", lambda *args: None)
    assert measure.measure_verify(target, [1, 4], [16], repeats=1, warmup=0) == [[2.5, 2.5]]
    verifies = [i for i, (what, _) in enumerate(log) if what == "verify"]
    assert len(verifies) == 2
    for at in verifies:  # before each verify: every device synchronised, then the start event on cuda:3
        before = log[:at]
        assert ("record", target.device) in before, before  # the start event on the LM head's device
        synced = {d for what, d in before[before.index(("record", target.device)) - 4 :] if what == "sync"}
        assert synced == set(target.devices), before
        assert log[at - 1] == ("record", target.device) and log[at + 1] == ("record", target.device)


@pytest.fixture(scope="module")
def tiny_moe():
    from conftest import load_tiny

    return load_tiny("tiny_qwen3_moe").target


def test_a_moe_verify_touches_more_experts_for_bigger_trees(tiny_moe):
    from graft.budget.experts import ExpertsTouched, pinned_routing
    from graft.budget.measure import ContextCache

    cache, touched = ContextCache(tiny_moe, 32, 16), ExpertsTouched(tiny_moe.model)
    try:
        per_nodes = []
        for n in (1, 2, 4, 8, 16):
            cache.verify_ms(n)
            per_nodes.append(touched.take())
        for m in (2, 3, 4):  # pinned: exactly m experts in every layer, whatever the router would pick
            with pinned_routing(tiny_moe.model, m):
                cache.verify_ms(16)
            assert touched.take() == [m] * tiny_moe.num_layers
    finally:
        touched.remove()
    means = [sum(c) / len(c) for c in per_nodes]
    assert per_nodes[0] == [2] * tiny_moe.num_layers  # one token: its top-2 in every layer
    assert means == sorted(means) and means[-1] > means[0] and means[-1] <= 4


def test_the_profile_carries_the_experts_and_costs_a_verify_by_them(tiny_moe, monkeypatch, tmp_path):
    """A fake clock on which each expert read costs 0.25 ms in each layer: the profile's sweep finds that
    price, and the modelled verify cost rises with the experts a tree touches."""
    from graft.budget import measure
    from graft.budget.experts import ExpertsTouched

    counter = ExpertsTouched(tiny_moe.model)

    def fake_ms(fn, target):
        counter.take()
        fn()
        return 1.0 + 0.25 * sum(counter.take())

    monkeypatch.setattr(measure, "elapsed_ms", fake_ms)
    try:
        moe = measure.measure_experts(tiny_moe, measure.ContextCache(tiny_moe, 32, 16), [1, 4, 16], repeats=2)
    finally:
        counter.remove()
    assert moe["experts"] == 4 and moe["top_k"] == 2 and moe["layers"] == tiny_moe.num_layers
    assert moe["sweep_experts"] == [2, 3, 4] and moe["expert_ms"] == pytest.approx(0.25)
    assert moe["sweep_ms"] == [1.0 + 0.25 * m * tiny_moe.num_layers for m in (2, 3, 4)]
    assert moe["experts_touched"][0] == 2 and moe["experts_touched"][-1] >= moe["experts_touched"][0]
    assert measure.measure_experts(ShardedStub(), None, [1], 1) is None  # a dense target has none

    profile = _profile(nodes=[1, 4, 16], verify_table_ms=[[30.0, 35, 45], [40.0, 50, 65]], overhead_table_ms=[1.0] * 3)
    profile.moe = moe
    profile.save(tmp_path / "moe.json")
    assert CostProfile.load(tmp_path / "moe.json") == profile
    costs = [profile.verify_ms(16, 256, experts=e) for e in (2, 2.5, 3, 3.5, 4)]
    assert costs == sorted(costs) and len(set(costs)) == 5  # increasing with the experts touched
    own = moe["experts_touched"][-1]
    assert profile.verify_ms(16, 256, experts=own) == pytest.approx(45.0)  # the profile's own routing: the table
    assert costs[-1] - costs[0] == pytest.approx(0.25 * tiny_moe.num_layers * 2)
    steps = [Step(accepted=2, nodes=16, context=256, draft_ms=0.0, experts=e) for e in (2, 4)]
    assert project(steps[1:], profile)["verify_ms_per_step"] > project(steps[:1], profile)["verify_ms_per_step"]


def test_project_on_a_killed_run_takes_the_partial_flag_it_points_to(tmp_path):
    """It said "pass --partial" and then refused --partial as an unknown argument."""
    _run_dir(tmp_path / "runs" / "killed")
    summary = json.loads((tmp_path / "runs" / "killed" / "summary.json").read_text())
    del summary["complete"]
    (tmp_path / "runs" / "killed" / "summary.json").write_text(json.dumps(summary))
    _profile().save(tmp_path / "profile.json")
    command = [sys.executable, "-m", "graft.costmodel", "project", str(tmp_path / "runs"), "--profile"]
    command += [str(tmp_path / "profile.json")]
    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass --partial" in refused.stderr
    shown = subprocess.run([*command, "--partial"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "| mt | graft" in shown.stdout, shown.stderr[-2000:]
