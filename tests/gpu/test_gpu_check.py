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
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from graft.decode import Generation
from graft.gpu_check import batched
from graft.gpu_check.__main__ import PARTS
from graft.gpu_check.batched import part_batched
from graft.gpu_check.dense import part_llama8b, prune_ratios
from graft.gpu_check.goals import failed, goal_rows
from graft.gpu_check.markdown import render
from graft.gpu_check.measure import bushy_parents, decode_record, per_step_rate
from graft.gpu_check.plan import FULL, QUICK
from graft.gpu_check.report import Context, Report, summarize
from graft.gpu_check.syncs import count_syncs, part_host_syncs

ROOT = Path(__file__).resolve().parents[2]
# The GPU node's image ('cuda', /work/.library/device/KINDS.md "Python packages already there", read 2026-11-17)
# and the wheels scripts/device_wheels.sh carries to it: what `python -m graft.gpu_check` may import there.
NODE_IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
CARRIED_WHEELS = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf"}  # scripts/device_wheels.sh
NODE_IMAGE = frozenset(NODE_IMAGE_PACKAGES.split()) | CARRIED_WHEELS
# As on the node: the harness's import of any installed distribution outside NODE_IMAGE fails (wandb, which is
# not installed here either, is blocked by name), so the check cannot come to need what the node lacks.
ON_NODE_IMAGE = """
import importlib.abc, importlib.metadata, re, sys
allowed = set(sys.argv.pop(1).split(",")) | {"graft-harness"}  # the project travels with the tree
owners = importlib.metadata.packages_distributions()
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()

def importer():
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
        frame = frame.f_back
    return "" if frame is None else frame.f_code.co_filename

class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        # the harness's own imports; what an installed library imports is its version's business (the node's
        # transformers is not this one)
        if "site-packages" in importer():
            return None
        dists = {norm(d) for d in owners.get(name.partition(".")[0], [])}
        if dists and not dists & allowed:
            raise ImportError(f"{name} ({', '.join(sorted(dists))}) is not in the GPU node's image")
        return None

sys.meta_path.insert(0, NotInImage())
sys.modules.update(wandb=None)
from graft.gpu_check.__main__ import main
sys.exit(main())
"""


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "quick.json"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            ON_NODE_IMAGE,
            ",".join(sorted(NODE_IMAGE)),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
def test_quick_mode_runs_every_part(quick):
    assert quick["finished"] and quick["quick"] and quick["device"] == "cpu"
    assert sorted(quick["parts"], key=int) == [str(n) for n in sorted(PARTS)]
    for number, part in quick["parts"].items():
        assert part["status"] == "ok", (number, part.get("error"), part.get("traceback"), part.get("reason"))
    assert quick["summary"]["status"] == {k: p["status"] for k, p in quick["parts"].items()}
    assert quick["elapsed_s"] < quick["budget_s"]


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
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


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
def test_quick_dense_target_timings(quick):
    dense, plan = quick["parts"]["4"]["result"], QUICK
    assert sorted(dense["verify"], key=int) == [str(c) for c in plan.dense_contexts]
    for rows in dense["verify"].values():
        assert sorted(rows, key=int) == [str(n) for n in plan.dense_nodes]
        assert all(_positive(r["median_ms"]) and r["min_ms"] <= r["median_ms"] for r in rows.values())
    assert dense["decode"]["clock"] == "host" and dense["decode"]["fixed_size_trees"]  # the GPU settings, on a CPU
    for setting in ("temperature_0", "temperature_1"):
        decode = dense["decode"][setting]
        for method in ("ar", "eagle3", "graft"):
            row = decode[method]
            assert row["new_tokens"] == plan.decode_tokens and row["steps"] >= 1, method
            assert _positive(row["step_ms"]) and _positive(row["verify_ms_per_step"])
            assert row["overhead_ms_per_step"] >= 0
        assert decode["ar"]["tau"] == 1.0 and decode["ar"]["mean_nodes"] == 1
        assert decode["eagle3"]["mean_nodes"] > 1  # the head's trees were verified
        assert decode["dflash"]["mean_nodes"] > 1  # the block drafter's chains were verified
    assert sorted(dense["prune_verify"], key=int) == [str(n) for n in sorted(plan.prune_nodes)]
    ratios = dense["ratios"]
    assert ratios["ar_over_bound_eager"] is None  # no HBM bound on a CPU
    assert all(
        _positive(ratios[k]) for k in ("eagle3_step_over_decode", "graft_step_over_decode", "eagle3_t1_over_greedy")
    )
    assert all(row["1"] == 1.0 for row in ratios["verify_over_decode"].values())
    assert dense["prefill_chunk"] == 48 < plan.extend_tokens  # the extend's prompt took the chunked prefill
    assert dense["head"]["layer_ids"] == [1, 2, 3]
    assert dense["extend"]["prompt_tokens"] == plan.extend_tokens and _positive(dense["extend"]["head_extend_ms"])


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
def test_quick_moe_layers_touch_more_experts_for_bigger_trees(quick):
    moe, arch = quick["parts"]["5"]["result"], QUICK.moe_arch
    verify = moe["verify"]
    assert sorted(verify, key=int) == [str(n) for n in QUICK.moe_nodes]
    assert all(_positive(r["median_ms"]) for r in verify.values())
    touched = {int(n): r["experts_touched_per_layer"] for n, r in verify.items()}
    assert touched[1] == arch["num_experts_per_tok"]  # one token: exactly its top-k experts
    assert touched[1] <= touched[128] <= arch["num_experts"]


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
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
    now = [0.0]  # a fake clock: a loaded machine must not move these budgets
    report = Report(tmp_path / "r.json", budget_s=100, header={}, clock=lambda: now[0])
    left = []
    report.run(1, lambda out: left.append(report.part_left()), budget_s=30, reserved_s=70)
    report.run(2, lambda out: left.append(report.part_left()), budget_s=70)  # part 1 left its 30 s unused
    assert left == [30, 100]

    def spend(seconds):
        now[0] += seconds
        left.append(report.part_left())

    report = Report(tmp_path / "r.json", budget_s=100, header={}, clock=lambda: now[0])
    report.run(1, lambda out: spend(20), budget_s=30, reserved_s=70)
    report.run(2, lambda out: spend(0), budget_s=70)  # what part 1 left of its 30 s goes to part 2
    assert left[-2:] == [10, 80]
    short = Report(tmp_path / "s.json", budget_s=30, header={}, clock=lambda: now[0])
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


def test_the_wheels_cover_what_the_node_lacks():
    wheels = (
        re.search(r"^PACKAGES=\((.*)\)", (ROOT / "scripts" / "device_wheels.sh").read_text(), re.M).group(1).split()
    )
    assert set(wheels) == CARRIED_WHEELS  # wandb: see the quick fixture
    for name in wheels:
        for line in importlib.metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"python_version": "3.12", "extra": ""}):
                assert req.name.lower() in NODE_IMAGE, (name, line)


def test_the_image_model_is_the_image():
    """The packages the issue and the device notes name are in it; what the node lacks is not."""
    assert {"torch", "transformers", "accelerate", "pandas", "scipy", "matplotlib", "rich", "psutil"} <= NODE_IMAGE
    assert not {"wandb", "hydra-core", "omegaconf", "gguf"} & frozenset(NODE_IMAGE_PACKAGES.split())


def test_the_image_blocker_refuses_what_the_node_lacks():
    """The quick fixture's import blocker itself: a distribution installed here but not in the model fails."""
    probe = "pytest"  # installed here and in the image: taken out of the model, its import must fail
    allowed = ",".join(sorted(NODE_IMAGE - {probe}))
    code = ON_NODE_IMAGE.replace("from graft.gpu_check.__main__ import main\nsys.exit(main())", f"import {probe}")
    done = subprocess.run([sys.executable, "-c", code, allowed], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "is not in the GPU node's image" in done.stderr


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
                "dispatcher": {
                    "tiny_llama temperature 0": {"ar": {"mean": 1.0, "max": 1}, "graft": {"mean": 1.25, "max": 2}},
                    "tiny_llama temperature 1": {"ar": {"mean": 1.0, "max": 1}},
                },
                "debug_mode": {"tiny_llama temperature 0": {"ar": {"syncs_per_step": 1.0}}},
                "ratios": {
                    "syncs_per_step_max": 2,
                    "syncs_per_step_sampled_max": 1,
                    "excess_syncs_max": 1,  # graft's worst step: 2 reads where 1 is allowed
                    "excess_syncs_sampled_max": 0,
                    "debug_mode_syncs_per_step_max": 1.0,
                },
            },
        },
        "4": {
            "name": "llama8b",
            "status": "failed",
            "seconds": 30.0,
            "error": "OutOfMemoryError: CUDA",
            "result": {
                "verify": {"1024": {"1": {"median_ms": 7.5}, "60": {"median_ms": 9.25}}},
                "ratios": {
                    "verify60_over_decode_1k": 1.233,
                    "eagle3_step_over_decode": 1.5,
                    "ar_over_bound_eager": 0.45,
                },
            },
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
                "ratios": {"graphs_timed": 0, "rerecords_timed": 3},
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
    assert "| model, sampling | ar | graft |" in md and "| tiny_llama temperature 0 | 1.0 / 1 | 1.25 / 2 |" in md
    assert "| 1024 | 7.5 | 9.25 |" in md  # a failed part's measurements so far
    assert "| ar | 2 / 2 | 48.2, 0.3 | - |" in md and "Qwen3-235B" not in md
    # each figure beside its goal, pass or fail; what no part measured is n/a
    assert "| verify(60) / decode at 1K context | 1.233 | <= 1.3 | pass | - |" in md
    assert "| verify(60) / decode at 8K context | - | <= 1.3 | n/a | - |" in md
    assert "| EAGLE-3 whole step / AR step (events clock) | 1.5 | <= 1.39 | FAIL | - |" in md
    assert "| host syncs per step, greedy, dispatcher counter (worst step) | 2 | (1 or 2) | - | - |" in md
    assert (
        "| host syncs per step beyond the allowed reads, greedy (dispatcher counter, worst step) | 1 | <= 0 | FAIL |"
        in md
    )
    assert "beyond the allowed reads, temperature 1 (dispatcher counter, worst step) | 0 | <= 0 | pass |" in md
    assert (
        "| CUDA-graph recordings in timed runs | 3 | 0 | FAIL | - |" in md
        and "| graphs compiled in timed runs | 0 | 0 | pass |" in md
    )
    assert "| AR decode: HBM bound / decode ms, eager (8B-shaped) | 0.45 | (no goal eager) | - | - |" in md
    tables = re.findall(r"(?:^\|.*\n)+", md, re.M)
    assert len(tables) == 8 and all(len({row.count("|") for row in t.splitlines()}) == 1 for t in tables)


def test_goals_pass_fail_and_not_measured():
    from graft.gpu_check.goals import GOALS, goal_rows

    parts = {"7": {"result": {"ratios": {"ar_over_bound_compiled": 0.61, "rerecords_timed": 0}}}}
    parts["2"] = {"result": {"ratios": {"lossless": True}}}
    parts["8"] = {"result": {"ratios": {"lossless": False, "lossless_note": "samd"}}}
    rows = {(r["part"], r["figure"]): r for r in goal_rows(parts)}
    assert len(rows) == len(GOALS)
    by = {r["figure"]: r["result"] for r in rows.values()}
    assert by["AR decode: HBM bound / decode ms, compiled (8B-shaped slice)"] == "pass"
    assert by["CUDA-graph recordings in timed runs"] == "pass" and by["graphs compiled in timed runs"] == "n/a"
    assert rows[("2", GOALS[-2].label)]["result"] == "pass"
    assert rows[("8", GOALS[-1].label)]["result"] == "FAIL" and rows[("8", GOALS[-1].label)]["note"] == "samd"
    parts["7"]["result"]["ratios"]["ar_over_bound_compiled"] = 0.59
    assert goal_rows(parts)[1]["result"] == "FAIL"


def test_syncs_are_counted_by_where_they_were_made(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)

    def run():
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("something else", stacklevel=1)
        return "done"

    result, sites = count_syncs(run)
    assert result == "done" and sum(sites.values()) == 3 and len(sites) == 1
    assert next(iter(sites)).startswith("tests/gpu/test_gpu_check.py:")


def test_explicit_synchronizes_are_counted_too(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    _, sites = count_syncs(lambda: [torch.cuda.synchronize() for _ in range(2)])
    assert list(sites.values()) == [2] and "(torch.cuda.synchronize)" in next(iter(sites))


class PretendCuda(Context):
    cuda = True  # part 3's code path on the CPU, where sync debug mode is stubbed and counts nothing


def test_host_sync_part_counts_at_the_dispatcher(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    report = Report(tmp_path / "r.json", budget_s=120, header={})
    plan = replace(QUICK, sync_models=("tiny_llama",), sync_methods=("ar", "graft"))
    ctx = PretendCuda(plan, torch.device("cpu"), quick=True, report=report)
    out: dict = {}
    part_host_syncs(ctx, out)
    assert sorted(out["dispatcher"]) == ["tiny_llama temperature 0", "tiny_llama temperature 1"]
    for setting, rows in out["dispatcher"].items():
        for method in ("ar", "graft"):
            row = rows[method]
            assert row["steps"] >= 2 and row["max"] >= row["mean"] >= 1, (setting, method, row)  # the path is read
            assert row["worst_step_sites"], (setting, method)  # named where
        debug = out["debug_mode"][setting]
        assert debug["ar"]["syncs"] == [0, 0] and debug["ar"]["syncs_per_step"] == 0.0  # stubbed: nothing reported
    worst = max(r["max"] for rows in out["dispatcher"].values() for r in rows.values() if True)
    sampled = max(r["max"] for r in out["dispatcher"]["tiny_llama temperature 1"].values())
    assert out["ratios"]["syncs_per_step_sampled_max"] == sampled <= worst
    # the device path (host paths off on a CPU): nothing beyond the path read and graft's kept-size read
    assert out["ratios"]["excess_syncs_max"] == 0 and out["ratios"]["excess_syncs_sampled_max"] == 0, out["ratios"]
    summary = summarize({"3": {"status": "ok", "result": out}})
    assert (
        summary["syncs_per_step"]["tiny_llama temperature 0"]["ar"]
        == out["dispatcher"]["tiny_llama temperature 0"]["ar"]["max"]
    )


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


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
def test_quick_compiled_path_is_lossless_and_timed(quick):
    part = quick["parts"]["7"]["result"]
    plan = QUICK
    assert part["totals"]["lossless"] and part["totals"]["checks"] == len(plan.compile_methods) * plan.lossless_prompts
    verify = part["verify"]
    for name in ("eager", "compiled"):
        assert sorted(verify[name], key=int) == [str(n) for n in plan.compile_nodes]
        assert all(_positive(row["median_ms"]) for row in verify[name].values())
    assert all(_positive(ratio) for ratio in verify["eager_over_compiled"].values())
    assert part["timed"] == {"graphs": 0, "recordings": 0}  # every prompt ran once: the reruns compile nothing
    assert part["ratios"]["graphs_timed"] == 0 == part["ratios"]["rerecords_timed"]


@pytest.mark.slow  # the quick device check on the CPU: every part, 35 s
def test_quick_syncs_and_sampling(quick):
    syncs = quick["parts"]["3"]["result"]
    assert sorted(syncs["dispatcher"]) == [f"{m} temperature {t}" for m in QUICK.sync_models for t in (0, 1)]
    for rows in syncs["dispatcher"].values():
        assert sorted(rows) == sorted(QUICK.sync_methods)
        assert all(row["max"] >= 1 for row in rows.values())  # every step reads at least its accepted path
    assert syncs["ratios"]["debug_mode_syncs_per_step_max"] is None  # sync debug mode needs CUDA
    sampled = quick["parts"]["8"]["result"]
    assert sorted(sampled["methods"]) == sorted({"ar", *QUICK.lossless_methods})
    assert all(row["draws"] == QUICK.sample_draws for row in sampled["methods"].values())
    assert sampled["ratios"]["lossless"] is True
    batch = quick["parts"]["9"]["result"]
    assert sorted(batch["methods"]) == sorted(QUICK.batch_methods)
    assert batch["ratios"]["batch_syncs_per_step_max"] == 1 and batch["ratios"]["batch_lossless"] is True
    assert quick["summary"]["batch_syncs_per_step"] == {m: 1 for m in QUICK.batch_methods}


def test_a_missed_timing_goal_fails_on_a_gpu_and_reads_na_on_a_cpu():
    """The device check exits 1 on a failed goal (graft/gpu_check/__main__.py: `failed`); a GPU timing goal measured
    on a CPU is "n/a (GPU goal)", never pass or fail, while lossless fails on any device."""
    from graft.gpu_check.goals import failed, goal_rows

    step = "EAGLE-3 whole step / AR step (events clock)"
    parts = {"4": {"result": {"ratios": {"eagle3_step_over_decode": 5.25}}}}
    assert failed(goal_rows(parts, "cuda")) == [step]
    on_cpu = {r["figure"]: r["result"] for r in goal_rows(parts, "cpu")}
    assert on_cpu[step] == "n/a (GPU goal)" and failed(goal_rows(parts, "cpu")) == []
    parts["2"] = {"result": {"ratios": {"lossless": False}}}
    assert failed(goal_rows(parts, "cpu")) == ["lossless, greedy: every method's tokens = AR's (float ties allowed)"]
    parts["4"]["result"]["ratios"]["eagle3_step_over_decode"] = 1.2
    parts["2"]["result"]["ratios"]["lossless"] = True
    assert failed(goal_rows(parts, "cuda:0")) == []


# --- part 9: a batch of 8; part 4's DFlash step and pruning's verify sizes ------------------------------------------

BATCH_SYNCS = "B = 8, greedy: host syncs per batched step, dispatcher counter (worst step of ar / eagle3 / graft)"
BATCH_LOSSLESS = "B = 8, greedy: every sequence's tokens = batch-1 AR's (float ties allowed)"
BATCH_LEAVE = (
    "B = 8: host syncs of a round sequences leave or join in, beyond its stated reads (1, + 1 for the leavers'"
    " records, + 1 per newcomer's first token; worst round)"
)
DFLASH_STEP = "DFlash whole step / AR step (events clock, random block drafter)"
PRUNE_16 = "pruning: verify(16) / verify(60) at 1K context (kept nodes in buckets of 8)"
PRUNE_STEP = "pruning: worst verify(smaller) / verify(next larger) over kept nodes 60, 32, 16, 8"


@pytest.fixture
def one_thread():
    """Tiny shapes gain nothing from threads, and on a loaded 2-core machine their spin-waits cost 5-10x (as
    graft/gpu_check/__main__.py sets for --quick on a CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_batched_part(tmp_path, methods=("ar",), context=Context, **sizes) -> tuple[dict, dict]:
    """Part 9 on tiny_llama on the CPU at small sizes: (its result, its goal rows by figure as a CPU run reads them)."""
    plan = replace(QUICK, batch_methods=methods, **{"batch_prompts": 8, "batch_tokens": 10, **sizes})
    ctx = context(plan, torch.device("cpu"), quick=True, report=Report(tmp_path / "r.json", budget_s=120, header={}))
    out: dict = {}
    part_batched(ctx, out)
    return out, {r["figure"]: r for r in goal_rows({"9": {"status": "ok", "result": out}}, "cpu")}


def test_the_batch_of_8_part_runs_on_the_cpu_and_reports_its_figures(tmp_path, one_thread):
    """Part 9 with the GPU settings on the CPU: one read per batched step (leaving steps apart), every sequence's
    tokens batch-1 AR's, tokens/s beside batch-1 AR's; the dispatcher goal holds on a CPU, debug mode is CUDA's."""
    out, rows = run_batched_part(tmp_path, ("ar", "eagle3"), batch_prompts=10)
    assert out["batch_size"] == 8 and out["prompts"] == 10 and out["tree_bucket"] == 0 and out["fixed_size_trees"]
    assert _positive(out["ar_batch1"]["tokens_per_s"]) and out["ar_batch1"]["new_tokens"] == 10 * 10
    for method in ("ar", "eagle3"):
        row = out["methods"][method]
        assert row["steps"] >= 5 and row["max"] == 1 and row["kinds"] == {"read": row["steps"]}, (method, row)
        assert row["leaving_steps"] >= 1 and row["joining_steps"] >= 1  # 10 prompts over 8 slots
        assert row["leave_join_excess_max"] == 0  # the leavers' records in one read, a read per newcomer's first token
        assert row["lossless"] == {"equal": 10, "checked": 10, "divergent": [], "lossless": True}
        assert row["new_tokens"] == 10 * 10 and _positive(row["tokens_per_s_over_ar_batch1"])
        assert "debug_mode_max" not in row  # sync debug mode needs CUDA
    ratios = out["ratios"]
    assert ratios["batch_syncs_per_step_max"] == 1 and ratios["batch_lossless"] is True
    assert ratios["batch_ar_over_ar1"] == out["methods"]["ar"]["tokens_per_s_over_ar_batch1"]
    assert "batch_graft_over_ar1" not in ratios  # not run here: its goal row reads n/a
    assert rows[BATCH_SYNCS]["result"] == "pass" and rows[BATCH_LOSSLESS]["result"] == "pass"
    debug = rows["B = 8, greedy: host syncs per batched step under set_sync_debug_mode (worst step)"]
    assert debug["result"] == "n/a" and debug["note"] == "sync debug mode needs CUDA"
    md = render({"device": "cpu", "parts": {"9": {"name": "batched", "status": "ok", "result": out}}})
    assert "## Batch of 8 (part 9: tiny_llama, float32, 10 prompts, 10 new tokens, greedy)" in md
    assert "| ar | 1.0 / 1 | - |" in md and f"| {BATCH_SYNCS} | 1 | <= 1 | pass |" in md


def test_a_batched_step_reading_each_slot_apart_fails_the_batch_sync_goal(tmp_path, monkeypatch, one_thread):
    """Negative control: every slot's acceptance read back on its own (B reads a step) fails the goal, and the
    leave-and-join rounds' goal with it; the debug-mode count runs per step too (stubbed here: CUDA's sync debug mode
    reports nothing on a CPU)."""
    from graft import acceptance

    monkeypatch.setattr(acceptance, "read_accepted", lambda pending: [p.read() for p in pending])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    out, rows = run_batched_part(tmp_path, context=PretendCuda)
    row = out["methods"]["ar"]
    assert row["max"] >= 3 and out["ratios"]["batch_syncs_per_step_max"] == row["max"], row
    assert row["debug_mode_max"] == 0 and row["lossless"]["lossless"]  # reading apart changes no token
    assert rows[BATCH_SYNCS]["result"] == "FAIL" and failed(list(rows.values())) == [BATCH_SYNCS, BATCH_LEAVE]


def test_one_altered_sequence_fails_the_lossless_at_b8_check(tmp_path, monkeypatch, one_thread):
    """Negative control: one sequence's token changed after the batch decoded it is a divergence that is no float
    tie, so the goal fails (and the check exits 1 on any device)."""
    real = batched.run_batch

    def altered(*args, **kwargs):
        done, seconds = real(*args, **kwargs)
        if len(done.get(3, Generation(0, [], "", 0.0, 0.0)).new_tokens) > 4:  # not the warm-up's 4 tokens
            done[3].new_tokens[4] = (done[3].new_tokens[4] + 1) % 200
        return done, seconds

    monkeypatch.setattr(batched, "run_batch", altered)
    out, rows = run_batched_part(tmp_path)
    lossless = out["methods"]["ar"]["lossless"]
    assert lossless["equal"] == 7 and lossless["checked"] == 8 and not lossless["lossless"]
    (divergence,) = lossless["divergent"]
    assert divergence["prompt"] == 3 and divergence["position"] == 4 and divergence["float_tie"] is False
    assert out["ratios"]["batch_lossless"] is False and out["ratios"]["batch_lossless_note"] == "ar"
    assert rows[BATCH_LOSSLESS]["result"] == "FAIL" and failed(list(rows.values())) == [BATCH_LOSSLESS]
    assert rows[BATCH_SYNCS]["result"] == "pass"


def test_pruning_ratios_are_the_verify_cost_at_kept_sizes():
    ms = {"60": 10.0, "32": 8.0, "16": 6.0, "8": 6.2}
    ratios = prune_ratios({n: {"median_ms": v} for n, v in ms.items()})
    assert ratios["prune_verify16_over_verify60"] == 0.6
    assert ratios["prune_verify_step_max"] == 1.033  # verify(8) / verify(16): within the 5 % allowed
    assert ratios["prune_verify_over_60"] == {"60": 1.0, "32": 0.8, "16": 0.6, "8": 0.62}


def test_the_dflash_and_pruning_goals_read_na_on_a_cpu_and_judge_on_a_gpu(tmp_path, one_thread):
    """Part 4 on the CPU (small shapes) times dflash's loop beside ar's and the verify at pruning's kept sizes; those
    goals read "n/a (GPU goal)" here, and pass or fail by their figures on a GPU."""
    plan = replace(
        QUICK, dense_contexts=(64,), dense_nodes=(1, 60), decode_methods=("ar", "dflash"), repeats=1, warmup=0
    )
    ctx = Context(plan, torch.device("cpu"), quick=True, report=Report(tmp_path / "r.json", budget_s=120, header={}))
    out: dict = {}
    part_llama8b(ctx, out)
    assert sorted(out["prune_verify"], key=int) == ["8", "16", "32", "60"]
    assert out["decode"]["temperature_0"]["dflash"]["mean_nodes"] > 1  # the block drafter's chains were verified
    ratios = out["ratios"]
    assert all(_positive(ratios[k]) for k in ("dflash_step_over_decode", "prune_verify16_over_verify60"))
    on_cpu = {r["figure"]: r["result"] for r in goal_rows({"4": {"result": out}}, "cpu")}
    assert on_cpu[DFLASH_STEP] == on_cpu[PRUNE_16] == on_cpu[PRUNE_STEP] == "n/a (GPU goal)"
    judged = {"dflash_step_over_decode": 1.5, "prune_verify16_over_verify60": 1.0, "prune_verify_step_max": 1.2}
    assert failed(goal_rows({"4": {"result": {"ratios": judged}}}, "cuda")) == [DFLASH_STEP, PRUNE_16, PRUNE_STEP]
    judged = {"dflash_step_over_decode": 1.3, "prune_verify16_over_verify60": 0.8, "prune_verify_step_max": 1.04}
    assert failed(goal_rows({"4": {"result": {"ratios": judged}}}, "cuda")) == []


def test_the_gpu_runs_batch_builds_a_slice_of_the_8b_shape_with_its_head(tmp_path, one_thread):
    """FULL's route (plan.batch_model None) at QUICK's small 8B shape (4 layers: EAGLE-3 taps three) on the CPU: the
    target built as part 4 builds it, eagle3's slots sharing one saved random head, one read per batched step, every
    sequence's tokens AR's."""
    out, rows = run_batched_part(tmp_path, ("eagle3",), batch_model=None, batch_layers=4, dtype="float32")
    assert out["model"] == "llama31_8b-shaped" and out["arch"]["num_hidden_layers"] == 4 and out["head"]["layer_ids"]
    row = out["methods"]["eagle3"]
    assert "error" not in row and row["max"] == 1 and row["lossless"]["lossless"], row
    assert rows[BATCH_SYNCS]["result"] == "pass" and rows[BATCH_LOSSLESS]["result"] == "pass"
