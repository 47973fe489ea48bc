"""split auto and trim auto: the tree size with the most expected tokens per millisecond."""

import pytest
import torch

from graft.methods.auto_budget import best_budget


def test_the_best_budget_maximises_expected_tokens_per_ms():
    probabilities = torch.tensor([0.05, 0.9, 0.1, 0.5])  # any order: the best are kept first
    costs = [30.0, 35.0, 40.0, 45.0, 50.0]  # N = 1..5 nodes
    # E(N) = 1, 1.9, 2.4, 2.5, 2.55 -> per ms .0333, .0543, .0600, .0556, .0510
    assert best_budget(probabilities, costs) == 3
    assert best_budget(probabilities, [30.0, 30.0, 30.0, 30.0, 30.0]) == 5  # free nodes: the whole budget
    assert best_budget(torch.tensor([0.01, 0.01]), [30.0, 60.0, 90.0]) == 1  # an unsure head: the root alone


def test_auto_needs_a_profile(tiny):
    from conftest import make_drafter

    from graft.schema import ConfigError

    with pytest.raises(ConfigError, match="method.cost_profile=nope.json: no such file"):
        make_drafter("eagle3_auto", tiny("tiny_llama").target, cost_profile="nope.json")


def _trim(verify_ms):
    """A trim auto whose profile has one context and verify(N) for N = 1.. of `verify_ms`, no loop overhead."""
    from graft.budget.profile import CostProfile
    from graft.methods.auto_budget import AutoTrim, TrimParams

    nodes = list(range(1, len(verify_ms) + 1))
    trim = AutoTrim(TrimParams())
    trim.profile = CostProfile("cpu: test", "tiny", nodes, [0], [list(verify_ms)], [0.0] * len(nodes))
    return trim


def test_most_per_ms_keeps_the_prefix_with_the_most_expected_tokens_per_ms():
    from graft.methods.auto_budget import most_per_ms

    # sums 1, 1.8, 2.3, 2.4 over 10, 11, 12, 20 ms -> .100, .164, .192, .120
    assert most_per_ms([1.0, 0.8, 0.5, 0.1], [10.0, 11.0, 12.0, 20.0]) == 3
    assert most_per_ms([1.0, 0.8, 0.5, 0.1], [10.0] * 4) == 4  # free nodes: all of them
    assert most_per_ms([1.0, 0.01], [10.0, 20.0]) == 1


def test_trim_auto_cuts_the_least_likely_nodes_and_keeps_the_tree_ancestor_closed():
    import math

    from graft.drafter import SequenceState
    from graft.tree import DraftTree

    # root 0; draft chain 0 -> 1 (p .9) -> 2 (p .9 of that); draft 0 -> 3 (p .05); retrieved 0 -> 4 -> 5
    log = math.log
    tree = DraftTree(
        tokens=torch.tensor([10, 11, 12, 13, 14, 15]),
        parents=torch.tensor([-1, 0, 1, 0, 0, 4]),
        scores=torch.tensor([0.0, log(0.9), log(0.81), log(0.05), -math.inf, -math.inf]),
        sources=torch.tensor([0, 1, 1, 1, 2, 2], dtype=torch.int8),
    )
    trim = _trim([10.0, 10.5, 11.0, 11.5, 15.0, 20.0])
    trim.start()
    values, places, parents = trim.values(tree)
    assert values[0] == 1.0 and values[2] <= values[1]  # a node never outvalues its parent
    assert values[5] <= values[4] == pytest.approx(0.5)  # a retrieved node's Beta(1, 1) prior: half its parent's
    cut = trim.cut(tree, SequenceState(tokens=[1, 2, 10], prompt_len=2))
    # a draft node: its parent's value x its bin's centre (.9 -> .95, .05 -> .05); retrieved: x 1/2. Values 1,
    # .95, .9025, .05, .5, .25: four nodes make 3.35 tokens in 11.5 ms (.291 a ms; three .259, five .240)
    assert cut.tokens.tolist() == [10, 11, 12, 14]
    assert cut.parents.tolist() == [-1, 0, 1, 0]
    assert cut.sources.tolist() == [0, 1, 1, 2]
    free = _trim([10.0] * 6)
    free.start()
    assert free.cut(tree, SequenceState(tokens=[1, 2, 10], prompt_len=2)) is tree  # free nodes: nothing cut


def test_trim_auto_checks_its_prior():
    from graft.methods.auto_budget import TrimParams

    assert TrimParams().cost_profile == "auto"  # this machine's costs unless a file is named
    with pytest.raises(ValueError, match="retrieval_prior"):
        TrimParams(retrieval_prior=[1.0, 0.0])


def test_auto_methods_default_to_costs_measured_where_they_run():
    from conftest import method_yaml

    for method in ("eagle3_auto", "graft_auto"):
        assert dict(method_yaml(method))["cost_profile"] == "auto"


def test_a_profile_measured_at_start_up_is_cached_and_reused(tiny, tmp_path, monkeypatch):
    from conftest import make_drafter

    from graft.budget import measure

    monkeypatch.setenv("GRAFT_COST_PROFILES", str(tmp_path))
    target = tiny("tiny_llama").target
    measured = make_drafter("eagle3_auto", target, total_tokens=4).split.profile
    (cached,) = tmp_path.glob("tiny_llama-*.json")  # one file for this model, dtype, machine and engine
    assert measured.nodes == [1, 2, 3, 4] and measured.contexts == list(measure.CALIBRATION_CONTEXTS)
    assert (measured.model, measured.dtype) == ("tiny_llama", "torch.float32")
    assert measured.device.startswith("cpu: ") and measured.engine.startswith("HFBackend")
    assert all(ms > 0 for row in measured.verify_table_ms for ms in row)

    def no_timing(*args, **kwargs):
        raise AssertionError("a cached profile was measured again")

    monkeypatch.setattr(measure, "measure_profile", no_timing)
    monkeypatch.setattr(measure, "elapsed_ms", no_timing)
    # another auto method on the same target, at a budget the cached sizes cover: loaded, not measured
    assert make_drafter("graft_auto", target, total_tokens=4).trim.profile == measured
    assert make_drafter("eagle3_auto", target, total_tokens=3).split.profile == measured
    with pytest.raises(AssertionError, match="measured again"):  # more nodes than were measured: measured
        make_drafter("eagle3_auto", target, total_tokens=6)


def _saved_profile(tmp_path, target, **changes):
    """This target's identity on a made-up table, with `changes`, saved to a file; its path."""
    from graft.budget.measure import identity
    from graft.budget.profile import CostProfile

    fields = {**identity(target), **changes}
    profile = CostProfile(
        **fields, nodes=[1, 8], contexts=[128], verify_table_ms=[[2.0, 3.0]], overhead_table_ms=[0.1, 0.1]
    )
    path = tmp_path / "profile.json"
    profile.save(path)
    return str(path)


def test_a_profile_file_of_another_target_is_refused_in_one_line(tiny, tmp_path, caplog):
    from conftest import make_drafter

    from graft.schema import ConfigError

    target = tiny("tiny_llama").target
    assert make_drafter("graft_auto", target, cost_profile=_saved_profile(tmp_path, target)).trim.profile.nodes == [
        1,
        8,
    ]
    other = _saved_profile(tmp_path, target, model="smollm2_135m")
    with pytest.raises(ConfigError) as err:
        make_drafter("graft_auto", target, cost_profile=other)
    message = str(err.value)
    assert "\n" not in message
    assert f"method.cost_profile={other} was measured for another target" in message
    assert "model 'smollm2_135m' (here 'tiny_llama')" in message
    # asked for, it is used anyway, with the same line as a warning
    drafter = make_drafter("graft_auto", target, cost_profile=other, cost_profile_mismatch="warn")
    assert drafter.trim.profile.model == "smollm2_135m"
    assert [r.levelname for r in caplog.records if r.getMessage().startswith("method.cost_profile=")] == ["WARNING"]


def test_a_torn_profile_file_is_a_one_line_error_naming_it(tiny, tmp_path):
    from conftest import make_drafter

    from graft.schema import ConfigError

    path = tmp_path / "torn.json"
    path.write_text('{"device": "cpu: x", "model": "tiny_llama", "nodes": [1, 2')
    with pytest.raises(ConfigError) as err:
        make_drafter("eagle3_auto", tiny("tiny_llama").target, cost_profile=str(path))
    assert str(err.value).startswith(f"{path} is not a cost profile (Expecting") and "\n" not in str(err.value)


def test_graft_auto_on_a_profile_measured_here_is_lossless(tiny, tmp_path, monkeypatch):
    from conftest import make_drafter

    from baselines.autoregressive import Autoregressive
    from graft.data.loading import BUILTIN
    from graft.decode import generate

    monkeypatch.setenv("GRAFT_COST_PROFILES", str(tmp_path))
    model = tiny("tiny_llama")
    target = model.target
    drafter = make_drafter("graft_auto", target, total_tokens=8)
    assert drafter.trim.profile.model == "tiny_llama"
    for turn in (BUILTIN[0].turns[0], BUILTIN[5].turns[0]):
        ids = model.chat.prompt_ids([{"role": "user", "content": turn}])
        base = generate(target, Autoregressive(target), ids, 32, model.stop_ids)
        out = generate(target, drafter, ids, 32, model.stop_ids)
        assert out.new_tokens == base.new_tokens
        assert max(out.nodes) <= 8


# --- at run.batch_size=B: the profile of B trees, each slot costing its share ------------------------------


def _batch_split(verify_ms: list[float], batch: int, monkeypatch):
    """A split auto on a profile of one context whose verify at 1 and 8 nodes is `verify_ms` (one forward of
    `batch` trees), no loop overhead, and a fake clock that makes every step's draft 1 ms."""
    from types import SimpleNamespace

    from graft.budget.profile import CostProfile
    from graft.methods import auto_budget

    ticks = iter(range(10**6))
    monkeypatch.setattr(auto_budget, "time", SimpleNamespace(perf_counter=lambda: 1e-3 * next(ticks)))
    split = auto_budget.AutoSplit(auto_budget.AutoParams(auto_context=512))
    split.profile = CostProfile("cpu: test", "tiny", [1, 8], [512], [verify_ms], [0.0, 0.0], batch=batch)
    return split


def test_at_batch_8_a_node_costs_its_share_of_the_batched_forward_and_the_tree_shrinks(monkeypatch):
    scores = torch.tensor([0.9, 0.8, 0.5, 0.3, 0.2, 0.15, 0.1]).log()  # E(N) = 1, 1.9, 2.7, 3.2, 3.5, 3.7, 3.85, 3.95
    # batch 1: verify(N) = 10 + (N - 1) / 7 ms, + 1 ms of draft: 3.95 / 12 (.329 a ms) beats 3.85 / 11.86 (.325)
    alone = _batch_split([10.0, 11.0], 1, monkeypatch)
    alone.start()
    assert alone.keep(scores, 8) == 8
    # batch 8: one forward of 8 trees is 16 ms at 1 node, 72 ms at 8: a sequence's share N + 1 ms, + 1 ms of
    # draft: 1 / 3, 1.9 / 4, 2.7 / 5 (.540 a ms), 3.2 / 6 (.533): three nodes
    batched = _batch_split([16.0, 72.0], 8, monkeypatch)
    batched.start()
    assert batched.keep(scores, 8) == 3
    assert batched.profile.verify_share_ms(8, 512) == 9.0


def test_a_profile_file_measured_at_another_batch_is_refused_naming_both(tiny, tmp_path):
    from conftest import method_yaml

    from graft.registry import build_drafter, method_config
    from graft.run.runner import cost_profile_batch
    from graft.schema import ConfigError

    target = tiny("tiny_llama").target
    path = _saved_profile(tmp_path, target, batch=8)
    method = method_config({**dict(method_yaml("graft_auto")), "cost_profile": path}, "random", "random")
    with pytest.raises(ConfigError) as err:
        build_drafter(method, target)  # a batch-1 run
    message = str(err.value)
    assert "\n" not in message and f"method.cost_profile={path} was measured for another target" in message
    assert "batch size 8 (here run.batch_size=1)" in message
    assert (
        "another target: batch size 8 (here run.batch_size=1); method.cost_profile=auto" in message
    )  # all that differs
    # the run it was measured for takes it, and records which batch the costs are of
    drafter = build_drafter(method, target, batch_size=8)
    assert drafter.trim.profile.batch == 8 and cost_profile_batch(drafter) == 8
    assert (
        cost_profile_batch(build_drafter(method_config(dict(method_yaml("graft")), "random", "random"), target)) is None
    )
    with pytest.raises(ConfigError, match=r"batch size 8 \(here run.batch_size=4\)"):
        build_drafter(method, target, batch_size=4)


def test_a_profile_at_batch_2_is_measured_through_verify_rows_cached_apart_and_reused(tiny, tmp_path, monkeypatch):
    from graft.budget import measure
    from graft.methods.auto_budget import AutoParams, AutoSplit

    monkeypatch.setenv("GRAFT_COST_PROFILES", str(tmp_path))
    target = tiny("tiny_llama").target
    rows = []
    verify_rows = target.verify_rows

    def counted(slots, first, trees, topos, taps=()):
        rows.append(len(trees))
        return verify_rows(slots, first, trees, topos, taps)

    monkeypatch.setattr(target, "verify_rows", counted)
    profile = measure.calibrated_profile(target, 3, seconds=0.5, batch=2)
    assert rows and set(rows) == {2}  # every timed forward verified 2 trees at once
    assert profile.batch == 2 and profile.nodes == [1, 2, 3] and profile.moe == {}
    assert all(ms > 0 for row in profile.verify_table_ms for ms in row)
    (cached,) = tmp_path.glob("*.json")  # batch 1's file is not this one
    assert cached.name.startswith("tiny_llama-b2-") and cached == measure.cache_path(measure.identity(target, 2))
    assert measure.cache_path(measure.identity(target)) != cached

    def no_timing(*args, **kwargs):
        raise AssertionError("a cached profile was measured again")

    monkeypatch.setattr(measure, "measure_profile", no_timing)
    split = AutoSplit(AutoParams())
    split.prepare(target, 3, batch_size=2)  # a slot's drafter of a batch-2 run: loaded, not measured
    assert split.profile == profile
    with pytest.raises(AssertionError, match="measured again"):  # batch 1 has no profile cached here
        measure.calibrated_profile(target, 3, seconds=0.5)
