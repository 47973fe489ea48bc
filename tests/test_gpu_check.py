"""python -m graft.gpu_check, the device check: its quick CPU mode end to end (every part ok or skipped, with
plausible numbers), and the report's rules (a failing part is recorded and the next runs; the budget skips)."""

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from graft.decode import Generation
from graft.gpu_check.measure import bushy_parents, decode_record, per_step_rate
from graft.gpu_check.plan import QUICK
from graft.gpu_check.report import Context, Report, summarize
from graft.gpu_check.syncs import count_syncs, part_host_syncs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "quick.json"
    done = subprocess.run(
        [sys.executable, "-m", "graft.gpu_check", "--device", "cpu", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_quick_mode_runs_every_part(quick):
    assert quick["finished"] and quick["quick"] and quick["device"] == "cpu"
    assert sorted(quick["parts"]) == ["1", "2", "3", "4", "5", "6", "7"]
    for number, part in quick["parts"].items():
        assert part["status"] in ("ok", "skipped"), (number, part.get("error"), part.get("traceback"))
    assert quick["parts"]["3"]["status"] == "skipped" and "CUDA" in quick["parts"]["3"]["reason"]
    assert quick["summary"]["status"] == {k: p["status"] for k, p in quick["parts"].items()}
    assert quick["elapsed_s"] < quick["budget_s"]


def test_quick_environment_and_lossless(quick):
    env = quick["parts"]["1"]["result"]
    assert env["python"].startswith("3.") and env["cpu_count"] >= 1 and env["torch"]
    assert env["sdpa_probe_bfloat16"]["math"] == {"causal": True, "masked": True}
    lossless = quick["parts"]["2"]["result"]
    plan = QUICK
    checks = len(plan.lossless_models) * len(plan.lossless_dtypes) * len(plan.lossless_methods) * plan.lossless_prompts
    assert lossless["totals"] == {
        "checks": checks,
        "equal": checks,
        "float_tie_divergences": 0,
        "other_divergences": 0,
        "errors": 0,
        "lossless": True,
    }


def test_quick_dense_target_timings(quick):
    dense, plan = quick["parts"]["4"]["result"], QUICK
    assert sorted(dense["verify"], key=int) == [str(c) for c in plan.dense_contexts]
    for rows in dense["verify"].values():
        assert sorted(rows, key=int) == [str(n) for n in plan.dense_nodes]
        assert all(_positive(r["median_ms"]) and r["min_ms"] <= r["median_ms"] for r in rows.values())
    for timing in ("timing_sync", "timing_async"):
        decode = dense["decode"][timing]
        for method in ("ar", "eagle3", "graft"):
            row = decode[method]
            assert row["new_tokens"] == plan.decode_tokens and row["steps"] >= 1, method
            assert _positive(row["step_ms"]) and _positive(row["verify_ms_per_step"])
            assert row["overhead_ms_per_step"] >= 0
        assert decode["ar"]["tau"] == 1.0 and decode["ar"]["mean_nodes"] == 1
        assert decode["eagle3"]["mean_nodes"] > 1  # the head's trees were verified
    assert dense["prefill_chunk"] == 48 < plan.extend_tokens  # the extend's prompt took the chunked prefill
    assert dense["head"]["layer_ids"] == [1, 2, 3]
    assert dense["extend"]["prompt_tokens"] == plan.extend_tokens and _positive(dense["extend"]["head_extend_ms"])


def test_quick_moe_layers_touch_more_experts_for_bigger_trees(quick):
    moe, arch = quick["parts"]["5"]["result"], QUICK.moe_arch
    verify = moe["verify"]
    assert sorted(verify, key=int) == [str(n) for n in QUICK.moe_nodes]
    assert all(_positive(r["median_ms"]) for r in verify.values())
    touched = {int(n): r["experts_touched_per_layer"] for n, r in verify.items()}
    assert touched[1] == arch["num_experts_per_tok"]  # one token: exactly its top-k experts
    assert touched[1] <= touched[128] <= arch["num_experts"]


def test_quick_head_with_its_own_head_dim_loads_and_runs(quick):
    head = quick["parts"]["6"]["result"]
    assert head["head_dim"] == 32 != head["hidden_over_heads"]
    assert head["layer_ids"] == head["expected_layer_ids"]
    assert head["log_probs"] == [4, QUICK.head235["draft_vocab_size"]]


def test_a_failing_part_is_recorded_and_the_next_one_runs(tmp_path):
    report = Report(tmp_path / "r.json", budget_s=60, header={})
    report.run(1, lambda out: out.update(before=1) or 1 / 0)
    report.run(2, lambda out: out.update(value=2))
    parts = json.loads((tmp_path / "r.json").read_text())["parts"]
    assert parts["1"]["status"] == "failed" and parts["1"]["error"].startswith("ZeroDivisionError")
    assert parts["1"]["result"] == {"before": 1}  # what it measured before failing stays
    assert any("ZeroDivisionError" in line for line in parts["1"]["traceback"])
    assert parts["2"]["status"] == "ok" and parts["2"]["result"] == {"value": 2}


def test_parts_after_the_budget_are_skipped(tmp_path):
    report = Report(tmp_path / "r.json", budget_s=0, header={})
    report.run(4, lambda out: out.update(ran=True))
    part = json.loads((tmp_path / "r.json").read_text())["parts"]["4"]
    assert part["status"] == "skipped" and "budget" in part["reason"] and "result" not in part


def test_syncs_are_counted_by_where_they_were_made(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)

    def run():
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("something else")
        return "done"

    result, sites = count_syncs(run)
    assert result == "done" and sum(sites.values()) == 3 and len(sites) == 1
    assert next(iter(sites)).startswith("tests/test_gpu_check.py:")


def test_explicit_synchronizes_are_counted_too(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    _, sites = count_syncs(lambda: [torch.cuda.synchronize() for _ in range(2)])
    assert list(sites.values()) == [2] and "(torch.cuda.synchronize)" in next(iter(sites))


class PretendCuda(Context):
    cuda = True  # part 3's code path on the CPU, where sync debug mode is stubbed and counts nothing


def test_host_sync_part_runs_its_loops(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    report = Report(tmp_path / "r.json", budget_s=60, header={})
    ctx = PretendCuda(QUICK, torch.device("cpu"), quick=True, report=report)
    out: dict = {}
    part_host_syncs(ctx, out)
    assert sorted(out) == ["note", "timing_async", "timing_async_static_trees", "timing_sync_static_trees"]
    for timing in ("timing_async", "timing_async_static_trees", "timing_sync_static_trees"):
        for method in ("ar", "eagle3", "pruned", "graft"):
            row = out[timing][method]
            assert row["syncs"] == [0, 0] and row["steps"][0] < row["steps"][1], (timing, method)
            assert row["syncs_per_step"] == 0.0
    summary = summarize({"3": {"status": "ok", "result": out}})
    assert summary["syncs_per_step"]["timing_sync_static_trees"]["ar"] == 0.0


def test_syncs_per_step_cancel_the_prefill():
    assert per_step_rate((13, 3), (23, 8)) == 2.0
    assert per_step_rate((13, 3), (13, 3)) is None


def test_decode_record_splits_the_step_into_forward_and_overhead():
    gen = Generation(prompt_len=4, new_tokens=[1, 2, 3, 4, 5], stop_reason="max_new_tokens", prefill_s=0.5, wall_s=0.54)
    gen.accept_lengths, gen.nodes, gen.draft_s = [2, 2], [5, 7], [0.001, 0.003]
    row = decode_record(gen, verify_ms=[15.0, 13.0])
    assert row["steps"] == 2 and row["tau"] == 2.0 and row["mean_nodes"] == 6
    assert row["step_ms"] == 20.0 and row["verify_ms_per_step"] == 14.0 and row["overhead_ms_per_step"] == 6.0
    assert row["draft_ms_per_step"] == 2.0


def test_trees_for_timing_are_valid_trees():
    parents = bushy_parents(60)
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)


def test_quick_compiled_path_is_lossless_and_timed(quick):
    part = quick["parts"]["7"]["result"]
    plan = QUICK
    assert part["totals"]["lossless"] and part["totals"]["checks"] == len(plan.compile_methods) * plan.lossless_prompts
    verify = part["verify"]
    for name in ("eager", "compiled"):
        assert sorted(verify[name], key=int) == [str(n) for n in plan.compile_nodes]
        assert all(_positive(row["median_ms"]) for row in verify[name].values())
    assert all(_positive(ratio) for ratio in verify["eager_over_compiled"].values())
