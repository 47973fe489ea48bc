"""python -m graft.gpu_check, the device check: its quick CPU mode end to end (every part ok or skipped, with
plausible numbers), the report's rules (a failing part is recorded and the next runs; the budgets), the
Markdown tables, and what the one device command (scripts/device_check.sh) needs: its 8 minutes and its wheels."""

import importlib.metadata
import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from graft.decode import Generation
from graft.gpu_check.__main__ import PARTS
from graft.gpu_check.markdown import render
from graft.gpu_check.measure import bushy_parents, decode_record, per_step_rate
from graft.gpu_check.plan import FULL, QUICK
from graft.gpu_check.report import Context, Report, summarize
from graft.gpu_check.syncs import count_syncs, part_host_syncs

ROOT = Path(__file__).resolve().parent.parent
# as on the GPU node, whose image lacks them (the wheels bring gguf, but the check must not need it)
WITHOUT_GGUF_AND_WANDB = (
    "import sys; sys.modules.update(gguf=None, wandb=None); from graft.gpu_check.__main__ import main; sys.exit(main())"
)


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "quick.json"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_GGUF_AND_WANDB, "--device", "cpu", "--quick", "--out", str(out)],
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


def test_a_part_may_use_what_the_earlier_ones_left_and_a_short_total_skips_the_last(tmp_path):
    report = Report(tmp_path / "r.json", budget_s=100, header={})
    left = []
    report.run(1, lambda out: left.append(report.part_left()), budget_s=30, reserved_s=70)
    report.run(2, lambda out: left.append(report.part_left()), budget_s=70)  # part 1 left its 30 s unused
    assert 29 < left[0] <= 30 and 99 < left[1] <= 100
    short = Report(tmp_path / "s.json", budget_s=30, header={})
    short.run(1, lambda out: None, budget_s=30, reserved_s=70)  # its own budget first, though the later ones' is short
    short.run(2, lambda out: None, budget_s=70)  # about 30 s left: less than half of 70
    parts = json.loads((tmp_path / "s.json").read_text())["parts"]
    assert parts["1"]["status"] == "ok" and parts["1"]["budget_s"] == 30
    assert parts["2"]["status"] == "skipped" and "the part's budget is 70 s" in parts["2"]["reason"]


def script_seconds(name: str) -> int:
    return int(re.search(rf"^{name}=(?:\$\{{{name}:-)?(\d+)", DEVICE_CHECK, re.M).group(1))


DEVICE_CHECK = (ROOT / "scripts" / "device_check.sh").read_text()
INSTALL_S = 20  # offline pip install of four small wheels (3 s on this CPU)


def test_the_one_device_command_fits_8_minutes():
    assert sorted(FULL.part_budget_s) == sorted(PARTS) == sorted(QUICK.part_budget_s)
    deadline = script_seconds("DEADLINE_S")
    overheads = INSTALL_S + script_seconds("GRACE_S") + script_seconds("KILL_S") + script_seconds("TABLE_S")
    assert FULL.total_budget_s + overheads <= deadline <= 8 * 60 - 10  # 10 s for the machine's own start of the run


NODE_IMAGE = {"numpy", "packaging", "pyyaml", "tqdm"}  # torch 2.11 / transformers 5.17's own requirements
LAZY = {"requests"}  # gguf imports it only to read remote files (gguf/utility.py), which the node cannot reach


def test_the_wheels_cover_what_the_node_lacks():
    wheels = (
        re.search(r"^PACKAGES=\((.*)\)", (ROOT / "scripts" / "device_wheels.sh").read_text(), re.M).group(1).split()
    )
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf"} <= set(wheels)  # wandb: see the quick fixture
    for name in wheels:
        for line in importlib.metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"python_version": "3.12", "extra": ""}):
                assert req.name.lower() in {*wheels, *NODE_IMAGE, *LAZY}, (name, line)


H200_FIXTURE = {  # made-up numbers in the shape a CUDA run writes: what the tables must show
    "argv": ["--out", "results/gpu/gpu_check.json", "--budget-s", "405"],
    "device": "cuda",
    "started_utc": "2026-12-04T10:00:00+00:00",
    "budget_s": 390.0,
    "elapsed_s": 401.3,
    "finished": True,
    "interrupted": True,
    "parts": {
        "1": {
            "name": "environment",
            "status": "ok",
            "seconds": 2.1,
            "budget_s": 10,
            "result": {
                "device_name": "NVIDIA H200",
                "memory_total_gib": 139.8,
                "torch": "2.11.0",
                "torch_cuda": "12.8",
                "python": "3.12.3",
                "packages": {"transformers": "5.17.0"},
                "nvidia_smi": {"driver_version": "570.1"},
            },
        },
        "2": {
            "name": "lossless",
            "status": "ok",
            "seconds": 120.4,
            "budget_s": 128.0,
            "result": {
                "truncated": "budget spent after 120 s; not checked: [('tiny_qwen3_moe', 'bfloat16')]",
                "models": {
                    "tiny_llama": {
                        "bfloat16": {
                            "graft": {
                                "equal": 1,
                                "checked": 2,
                                "divergent": [{"prompt": 1, "float_tie": True}],
                                "seconds": [1],
                            },
                            "samd": {
                                "equal": 0,
                                "checked": 0,
                                "divergent": [],
                                "seconds": [],
                                "error": "RuntimeError: x",
                            },
                        }
                    }
                },
            },
        },
        "3": {
            "name": "host_syncs",
            "status": "ok",
            "seconds": 9.0,
            "budget_s": 25,
            "result": {
                "timing_async_static_trees": {"ar": {"syncs_per_step": 1.0}, "graft": {"syncs_per_step": 1.25}},
                "timing_sync_static_trees": {"ar": {"syncs_per_step": 4.0}},
            },
        },
        "4": {
            "name": "llama8b",
            "status": "failed",
            "seconds": 30.0,
            "error": "OutOfMemoryError: CUDA",
            "result": {"verify": {"1024": {"1": {"median_ms": 7.5}, "60": {"median_ms": 9.25}}}},
        },
        "5": {"name": "moe235b_layers", "status": "skipped", "reason": "budget: 10 s left of --budget-s 390"},
        "7": {
            "name": "compiled",
            "status": "interrupted",
            "seconds": 61.0,
            "budget_s": 110,
            "reason": "SIGTERM (the run's time limit) during this part",
            "result": {
                "mode": "reduce-overhead",
                "backend": "inductor",
                "methods": {"ar": {"equal": 2, "checked": 2, "divergent": [], "seconds": [48.2, 0.3]}},
            },
        },
    },
}


def test_the_markdown_tables_render_from_the_json():
    md = render(H200_FIXTURE)
    assert md.startswith("# Device check: NVIDIA H200\n") and "budget, stopped by SIGTERM (the time limit)." in md
    assert "| NVIDIA H200 | 139.8 | 570.1 | 2.11.0 | 12.8 | 5.17.0 | 3.12.3 |" in md
    assert "| 5 | moe235b_layers | skipped | - | - | budget: 10 s left of --budget-s 390 |" in md
    assert "| 4 | llama8b | failed | 30 | - | OutOfMemoryError: CUDA |" in md
    assert "| tiny_llama | bfloat16 | 1 / 2 | 1 (1 float ties) | samd |" in md
    assert "not checked: [('tiny_qwen3_moe', 'bfloat16')]" in md  # part 2's truncation, in the parts table
    assert "| method | timing_async_static_trees | timing_sync_static_trees |" in md and "| graft | 1.25 | - |" in md
    assert "| 1024 | 7.5 | 9.25 |" in md  # a failed part's measurements so far
    assert "| ar | 2 / 2 | 48.2, 0.3 | - |" in md and "Qwen3-235B" not in md
    tables = re.findall(r"(?:^\|.*\n)+", md, re.M)
    assert len(tables) == 6 and all(len({row.count("|") for row in t.splitlines()}) == 1 for t in tables)


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
