"""The command line, end to end: `python run.py ...` as a user runs it, each command in its own process (forked
from one shared start-up: conftest.RunServer)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_forked

pytestmark = pytest.mark.slow  # run.py end to end, the embedded model too (2 min): `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {
    "model",
    "method",
    "dataset",
    "n_prompts",
    "tau",
    "speedup_wall",
    "speedup_decode",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "lossless",
    "avg_nodes_per_step",
    "hardware",
}


def run_cli(*args, check=True):
    proc = run_forked(list(args), timeout=900)  # `python run.py ARGS run.progress=false`, its start-up shared
    if check and proc.returncode != 0:
        raise AssertionError(
            f"run.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def lines(path: Path) -> list[str]:
    return (path / "samples.jsonl").read_text().splitlines()


@pytest.mark.embedded
def test_embedded_model_end_to_end(tmp_path):
    common = ["run.num_prompts=2", "run.max_new_tokens=16", "logger=none"]
    proc = run_cli("method=pld", f"run.out_dir={tmp_path / 'pld'}", *common)
    pld = json.loads((tmp_path / "pld" / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(pld)
    assert pld["method"] == "pld" and pld["lossless"] is True
    assert "speedup_wall" in proc.stdout
    record = json.loads(lines(tmp_path / "pld")[0])
    turn = record["method"]["turns"][0]
    assert turn["new_tokens"] == 16 or turn["stop_reason"] == "stop_token"
    assert len(turn["accept_lengths"]) == turn["steps"] == len(turn["draft_ms"]) == len(turn["verify_ms"])

    proc = run_cli(f"run.out_dir={tmp_path / 'default'}", *common)  # the default run: the comparison
    default = json.loads((tmp_path / "default" / "summary.json").read_text())
    compared = ["pld", "eagle3", "pruned", "graft", "graft_auto"]
    assert list(default["rows"]) == ["ar", *compared]
    ar = default["rows"]["ar"]  # the baseline, run once per prompt for every method
    assert default["model"] == "smollm2_135m" and ar["tau"] == 1.0 and ar["speedup_wall"] == 1.0
    assert all(default["rows"][m]["lossless"] for m in compared)
    assert default["rows"]["pld"]["tau"] == pld["tau"]  # the same tokens as pld's own run
    assert "graft" in proc.stdout and (tmp_path / "default" / "pareto.png").exists()


def test_too_long_prompts_are_skipped_and_recorded(tmp_path):
    out = tmp_path / "long"
    run_cli("experiment=smoke", "run.num_prompts=null", "model.max_context=200", f"run.out_dir={out}")
    records = [json.loads(line) for line in lines(out)]
    skipped = [r for r in records if r["status"] == "skipped"]
    ok = [r for r in records if r["status"] == "ok"]
    assert len(records) == 16 and skipped and ok
    assert all("context 200" in r["reason"] for r in skipped)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_skipped"] == len(skipped) and summary["n_prompts"] == len(ok)


def test_resume_and_refusal_of_another_config(tmp_path):
    out = tmp_path / "resume"
    run_cli("experiment=smoke", f"run.out_dir={out}")
    first = lines(out)
    assert len(first) == 2

    proc = run_cli("experiment=smoke", "run.max_new_tokens=8", f"run.out_dir={out}", check=False)
    assert proc.returncode == 2
    assert "different config" in proc.stderr and "run.max_new_tokens" in proc.stderr
    assert lines(out) == first  # nothing lost

    # a torn last line (killed mid-write) is dropped and that prompt reruns
    (out / "samples.jsonl").write_text("\n".join(first) + "\n" + first[1][:40])
    run_cli("experiment=smoke", "run.num_prompts=3", f"run.out_dir={out}")
    resumed = lines(out)
    assert len(resumed) == 3 and resumed[:2] == first
    assert [json.loads(line)["id"] for line in resumed] == ["chat-1", "chat-2", "chat-3"]

    # a rerun asking for fewer prompts summarises those only, and says the others were left out
    proc = run_cli("experiment=smoke", "run.num_prompts=1", f"run.out_dir={out}")
    assert json.loads((out / "summary.json").read_text())["n_prompts"] == 1
    assert "2 records in" in proc.stdout and "outside this selection" in proc.stdout
    assert len(lines(out)) == 3  # nothing deleted


def test_bench_forward_writes_a_cost_profile(tmp_path):
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "graft.costmodel",
            "forward",
            "model=tiny_llama",
            "--paths",
            "none,packed/python,packed",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = json.loads(out.read_text())
    assert profile["bandwidth_limit_ms"] > 0 and profile["fast_path"] == "packed"
    if shutil.which(os.environ.get("CXX", "c++")):  # graft/cpu/native builds where there is a compiler
        assert profile["paths"]["packed"]["kernels"]["native"] == "on"
        if profile["fma_rate_gfmas"] is not None:  # a vector build: the compute roof beside the bandwidth limit
            packed = profile["paths"]["packed"]
            assert profile["fma_rate_gfmas"] > 0 and packed["product_fmas"] > 0
            assert all(packed["roofline_ms"][k] >= packed["bandwidth_limit_ms"] for k in packed["verify_ms"])
            assert "roofline" in proc.stdout
    assert profile["paths"]["packed/python"]["kernels"]["native"] == "off"
    for side in ("plain", "fast"):
        assert profile[side]["decode_ms"] > 0
        assert set(profile[side]["verify_ms"]) == {"1", "2", "4", "8", "16", "32", "60", "128"}
    assert "bandwidth" in proc.stdout and "verify" in proc.stdout


@pytest.mark.skipif(not shutil.which(os.environ.get("CXX", "c++")), reason="graft/cpu/native needs a C++ compiler")
def test_ab_native_times_two_builds_in_one_process_and_checks_their_bits(tmp_path):
    out = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, "-m", "graft.bench", "native-ab", "model=tiny_llama", "--ref", "HEAD", "--contexts", "40"]
        + ["--tokens", "1,4", "--rounds", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["contexts"]["40"]) == {"1", "4"}
    assert all(r["old"] > 0 and r["new"] > 0 for r in report["contexts"]["40"].values())


@pytest.mark.skipif(not shutil.which(os.environ.get("CXX", "c++")), reason="graft/cpu/native needs a C++ compiler")
def test_ab_native_refuses_a_revision_whose_loop_reads_other_layer_fields():
    # eb65213: before one_row joined LAYER_FIELDS (its loop read 15 tensors a layer, this one 19)
    proc = subprocess.run(
        [sys.executable, "-m", "graft.bench", "native-ab", "model=tiny_llama", "--ref", "eb65213", "--contexts", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0 and "one weights list cannot serve both builds" in proc.stderr, proc.stderr[-3000:]


def test_a_forward_roofline_is_the_slower_of_streaming_the_weights_and_the_products_arithmetic():
    from graft.costmodel.forward import roofline_ms

    # the embedded model's 134,479,872 product FMAs a row at 102 G FMA/s: 1.318 ms a row of arithmetic
    assert roofline_ms(1, 134_479_872, 102.0, 15.0) == 15.0  # one row: the weights' stream bounds it
    assert abs(roofline_ms(16, 134_479_872, 102.0, 15.0) - 21.0949) < 1e-3  # 16 rows: the arithmetic does


def test_a_comparison_shares_one_baseline_per_prompt_and_resumes(tmp_path):
    out = tmp_path / "compare"
    common = ["model=tiny_llama", "methods=[pld,graft]", "run.max_new_tokens=12", "logger=none", f"run.out_dir={out}"]
    proc = run_cli(*common, "run.num_prompts=2")
    records = [json.loads(line) for line in lines(out)]
    assert [r["id"] for r in records] == ["chat-1", "chat-2"]
    for record in records:  # one baseline per prompt, every method beside it
        assert set(record) >= {"baseline", "methods"} and "method" not in record
        assert set(record["methods"]) == {"pld", "graft"}
        assert all(m["lossless"]["equal"] for m in record["methods"].values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "comparison" and list(summary["rows"]) == ["ar", "pld", "graft"]
    for name in ("pld", "graft"):  # one summary per method, with a single run's keys
        single = json.loads((out / "summaries" / f"{name}.json").read_text())
        assert SUMMARY_KEYS <= set(single) and single["method"] == name and single["n_prompts"] == 2
    assert summary["rows"]["graft"]["tau"] == json.loads((out / "summaries" / "graft.json").read_text())["tau"]
    assert (out / "pareto.png").stat().st_size > 0
    assert "graft" in proc.stdout and "speedup_decode" in proc.stdout
    run_cli(*common, "run.num_prompts=3")  # resumes: the two finished prompts are not rerun
    again = [json.loads(line) for line in lines(out)]
    assert [r["id"] for r in again] == ["chat-1", "chat-2", "code-1"] and again[:2] == records  # builtin_quick


def test_naming_one_method_makes_a_single_run_and_a_method_and_methods_together_are_refused(tmp_path):
    from graft.config.override_checks import check_overrides

    assert check_overrides(["method=pld"])[-1] == "methods=null"
    assert "methods=null" not in check_overrides(["methods=[pld,graft]", "method.total_tokens=16"])
    proc = run_cli("model=tiny_llama", "methods=[pld]", "method=graft", f"run.out_dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "give one of them" in proc.stderr
    proc = run_cli("model=tiny_llama", "methods=[pld,nope]", f"run.out_dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "unknown method 'nope'" in proc.stderr
    proc = run_cli("model=tiny_llama", "methods=[pld]", "method.depth=3", f"run.out_dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "method.depth is a key of none of the compared methods" in proc.stderr


def test_a_multirun_writes_a_dir_per_job_and_a_rerun_skips_finished_jobs(tmp_path):
    args = [
        "-m",
        "method=pld,suffix",
        "model=tiny_llama",
        "run.num_prompts=2",
        "run.max_new_tokens=8",
        "logger=none",
        f"hydra.sweep.dir={tmp_path}",
    ]
    run_cli(*args)
    jobs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    assert len(jobs) == 2
    before = {job: (job / "samples.jsonl").read_text() for job in jobs}
    assert all(json.loads((job / "summary.json").read_text())["complete"] for job in jobs)
    proc = run_cli(*args)
    assert proc.stderr.count("already complete") + proc.stdout.count("already complete") == 2
    assert {job: (job / "samples.jsonl").read_text() for job in jobs} == before


def test_a_failed_start_does_not_block_the_corrected_rerun(tmp_path):
    # the one-line errors themselves: tests/harness/test_bad_input.py
    out = tmp_path / "run"
    common = ("model=tiny_llama", "method=eagle3", "logger=none", "run.num_prompts=1", "run.max_new_tokens=4")
    proc = run_cli(*common, f"method.head={tmp_path / 'no_head'}", f"run.out_dir={out}", check=False)
    assert proc.returncode == 2 and "no such directory" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "run.json").exists()  # the run never started
    run_cli(*common, f"run.out_dir={out}")  # the corrected command, same folder
    assert json.loads((out / "summary.json").read_text())["n_prompts"] == 1
    assert (out / ".hydra").is_dir() and not (ROOT / "outputs" / "tiny_llama" / "eagle3").exists()


def test_a_failed_job_does_not_stop_the_sweep_and_is_named_at_the_end(tmp_path):
    out = tmp_path / "sweep"
    args = ("-m", "model=tiny_llama", "method=ar", "logger=none", "run.num_prompts=1", f"run.out_dir={out}")
    proc = run_cli(*args, "run.max_new_tokens=0,4", check=False)
    assert proc.returncode == 1
    failed = list(out.glob("*max_new_tokens=0*/failed.json"))
    assert len(failed) == 1 and "run.max_new_tokens=0" in json.loads(failed[0].read_text())["error"]
    assert len(list(out.glob("*max_new_tokens=4*/summary.json"))) == 1  # the job after it ran
    assert "1 job(s) of the sweep failed" in proc.stderr
