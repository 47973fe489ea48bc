"""The SLURM launcher (configs/hydra/launcher/graft_slurm.yaml): every job of every experiment is asked for the
GPUs (of a type, as gres or constraint) and the host memory its model needs, a sweep that would ask otherwise is
refused before submitting (memory: raised to the most a job needs), a job that times out is requeued into its own
folder and continues its records there, and a failed job exits non-zero under SLURM while a local sweep goes on
past it and names it at the end."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from graft.config.hydra_setup import CONFIG_DIR, group_options, register_schemas
from graft.config.overrides import prepare_overrides
from graft.plan.hardware import register_resolvers

pytestmark = pytest.mark.slow  # sweeps through submitit's local launcher (about 45 s): `make test-fast` leaves it out

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher (the slurm extra) is not installed"
)


def model_needs(model: str) -> int:
    """H200s a model needs: Qwen3-235B-A22B's bfloat16 weights are 470 GB, every other model here fits one."""
    return {"qwen3_235b": 4, "llama33_70b": 2}.get(model, 1)


def launcher_and_jobs(overrides: list[str], callback: bool = False):
    """The SLURM launcher as Hydra instantiates it for `python run.py -m <overrides> hydra/launcher=graft_slurm`
    (its parameters resolved in the sweep's primary config, as submitit sends them; with `callback`, after the
    launcher's SlurmGpus callback saw the sweep, as in a real sweep), and every job's (overrides, model, GPU
    request, mem_gb) from graft.run.sweeps.job_requests, which composes each job as the job does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext

    from graft.run.sweeps import SlurmGpus, job_requests

    register_schemas()
    register_resolvers()  # ${gpus_needed:}, as run.py registers it
    setup_globals()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=prepare_overrides([*overrides, "hydra/launcher=graft_slurm"]), return_hydra_config=True
        )
        loader = GlobalHydra.instance().config_loader()
        if callback:
            SlurmGpus().on_multirun_start(cfg)
        context = HydraContext(config_loader=loader, callbacks=None)
        launcher = Plugins.instance().instantiate_launcher(hydra_context=context, task_function=None, config=cfg)
        launcher.setup(hydra_context=context, task_function=None, config=cfg)
        return launcher, job_requests(cfg, loader)


PAPER_JOBS = {"paper_short": 3 * 5 * 2, "paper_large": 5 * 2, "paper_long": 2, "paper_dflash": 5}


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_job_of_every_experiment_asks_for_its_models_gpus(experiment):
    launcher, jobs = launcher_and_jobs([f"experiment={experiment}"])
    assert type(launcher).__name__ == "SlurmLauncher" and launcher.params["timeout_min"] > 0
    for overrides, model, gpus, _ in jobs:
        assert f"gres={launcher.params['gres']}" == gpus == f"gres=gpu:h200:{model_needs(model)}", (overrides, model)
    assert len(jobs) == PAPER_JOBS.get(experiment, len(jobs))


def test_a_model_on_the_command_line_replaces_the_experiments_models():
    launcher, jobs = launcher_and_jobs(["experiment=paper_short", "model=qwen3_235b"])
    assert launcher.params["gres"] == "gpu:h200:4"
    assert len(jobs) == 5 * 2 and {(model, gpus) for _, model, gpus, _ in jobs} == {("qwen3_235b", "gres=gpu:h200:4")}


# (model, GRAFT_SLURM_GPU, GRAFT_SLURM_CONSTRAINT) -> gres, constraint, mem_gb. Host memory: the bfloat16 weights
# (16 GB for 8B, 470 GB for 235B) and the three draft heads once, plus 32 GB, in steps of 32 GB
RESOURCES = [
    ("llama31_8b", None, None, "gpu:h200:1", None, 64),
    ("qwen3_235b", None, None, "gpu:h200:4", None, 512),
    ("qwen3_235b", "h100", None, "gpu:h100:7", None, 512),  # 80 GB GPUs: seven of them
    ("qwen3_235b", "h200", "h200", "gpu:4", "h200", 512),  # a cluster that types its GPUs as node features
    ("llama31_8b", "a100", "a100&ib", "gpu:1", "a100&ib", 64),
]


@pytest.mark.parametrize("model,gpu,constraint,gres,wanted_constraint,mem_gb", RESOURCES)
def test_each_model_asks_for_its_gpu_type_count_and_memory_and_is_requeued(
    monkeypatch, model, gpu, constraint, gres, wanted_constraint, mem_gb
):
    for name, value in (("GRAFT_SLURM_GPU", gpu), ("GRAFT_SLURM_CONSTRAINT", constraint)):
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    launcher, _ = launcher_and_jobs(["experiment=paper_short", f"model={model}"])
    params = launcher.params
    assert (params["gres"], params["constraint"], params["mem_gb"]) == (gres, wanted_constraint, mem_gb)
    assert params["gpus_per_node"] is None  # the count is in gres, asked once
    assert params["max_num_timeout"] == 3 and params["timeout_min"] == 720


def test_an_unknown_gpu_type_is_refused_naming_the_allowed_ones(monkeypatch):
    monkeypatch.setenv("GRAFT_SLURM_GPU", "v100")
    with pytest.raises(Exception, match="GPU type 'v100'; allowed: h200, h100, a100"):
        launcher_and_jobs(["experiment=paper_short", "model=llama31_8b"])


def test_a_sweep_over_models_of_one_gpu_count_asks_the_memory_of_the_largest():
    # paper_long: llama31_8b (64 GB) and qwen3_14b (96 GB), one H200 each; the primary config names llama31_8b
    launcher, jobs = launcher_and_jobs(["experiment=paper_long"], callback=True)
    needs = {model: mem for _, model, _, mem in jobs}
    assert needs == {"llama31_8b": 64, "qwen3_14b": 96}
    assert launcher.params["mem_gb"] == 96 and launcher.params["gres"] == "gpu:h200:1"


def test_a_timed_out_job_is_resubmitted_as_the_same_job():
    """What submitit calls when a job reaches its time limit (its `checkpoint`, max_num_timeout times): the same
    callable with the same arguments, so the same overrides, job number and sweep folder, hence the same job
    folder, where the run resumes (next test)."""
    from hydra.core.singleton import Singleton

    launcher, jobs = launcher_and_jobs(["experiment=paper_short", "model=llama31_8b"])
    arguments = (jobs[3][0], "hydra.sweep.dir", 3, "job_id_for_3", Singleton.get_state())
    resubmission = launcher.checkpoint(*arguments)
    assert resubmission.function is launcher and resubmission.args == arguments


def test_a_sweep_whose_jobs_need_other_gpus_is_refused_before_submitting(tmp_path):
    done = run_py(
        ["-m", "experiment=paper_short", "model=llama31_8b,qwen3_235b", "hydra/launcher=graft_slurm"], tmp_path
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model=qwen3_235b needs gres=gpu:h200:4" in done.stderr
    for model in ("llama31_8b", "qwen3_235b"):
        assert f"python run.py -m experiment=paper_short model={model} hydra/launcher=graft_slurm" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing submitted, not even the sweep's folder


def test_a_job_at_batch_32_asks_for_one_gpu_and_the_host_memory_of_batch_1():
    """A batched run decodes on one GPU, and its draft caches live there: only the GPU's fit changes with B."""
    launcher, jobs = launcher_and_jobs(
        ["experiment=paper_short", "model=llama31_8b", "run.batch_size=32"], callback=True
    )
    assert (launcher.params["gres"], launcher.params["mem_gb"]) == ("gpu:h200:1", 64)
    assert len(jobs) == 5 * 2 and all("run.batch_size=32" in overrides for overrides, *_ in jobs)
    assert {(gpus, mem) for _, _, gpus, mem in jobs} == {("gres=gpu:h200:1", 64)}


def test_a_sweep_with_a_batch_size_no_gpu_holds_is_refused_before_submitting(tmp_path):
    """paper_long's Llama-3.1-8B at B = 32: 279.5 GB of KV cache, and a batched run does not shard (the sizes:
    tests/harness/test_memory.py); the sweep names the job and the largest B that fits one H200."""
    done = run_py(
        ["-m", "experiment=paper_long", "model=llama31_8b", "run.batch_size=1,32", "hydra/launcher=graft_slurm"],
        tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    job = re.search(r"error: job ([^:]*): run\.batch_size=32 does not fit one GPU with 150\.1 GB", done.stderr)
    assert job and set(job[1].split()) == {"model=llama31_8b", "experiment=paper_long", "run.batch_size=32"}
    assert "run.batch_size=12 is the most that fits one" in done.stderr and "Nothing was submitted" in done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())


def run_py(args: list[str], out_dir, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    return subprocess.run(
        [sys.executable, "run.py", *args, f"run.out_dir={out_dir}"],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


# job 0 fails its config check, job 1 runs: one prompt, transformers' forward (the CPU engine's kernel timing at load
# would cost more than the test)
FAILING_SWEEP = ["-m", "experiment=smoke", "run.num_prompts=1", "hardware=cpu_plain", "run.temperature=-1.0,0.0"]
FAILED_JOB, OTHER_JOB = "0_hardware=cpu_plain,run.temperature=-1.0", "1_hardware=cpu_plain,run.temperature=0.0"


def test_a_local_sweep_goes_on_past_a_failed_job_and_names_it(tmp_path):
    done = run_py(FAILING_SWEEP, tmp_path, SLURM_JOB_ID="7")  # even inside an allocation: not submitted by submitit
    assert done.returncode == 1, done.stderr[-2000:]
    assert "1 job(s) of the sweep failed" in done.stderr and FAILED_JOB in done.stderr
    assert (tmp_path / FAILED_JOB / "failed.json").exists() and (tmp_path / OTHER_JOB / "summary.json").exists()


def test_a_job_submitted_to_slurm_exits_non_zero(tmp_path):
    # submitit's sbatch script exports both; under SLURM each job is its own process, here the local launcher
    # runs them in one, so the job's exit also ends the sweep: job 1 never starts and no summary is printed
    done = run_py(FAILING_SWEEP, tmp_path, SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="7")
    assert done.returncode == 1, done.stderr[-2000:]
    assert (tmp_path / FAILED_JOB / "failed.json").exists()
    assert "of the sweep failed" not in done.stderr and not (tmp_path / OTHER_JOB).exists()


def test_a_job_relaunched_into_its_folder_continues_its_records(tmp_path):
    """A job killed by its time limit after its first prompt, relaunched (as submitit requeues it) into the same
    folder with the same overrides: the first record is kept as written and only the second prompt runs."""
    job = ["experiment=smoke", "run.num_prompts=2", "hardware=cpu_plain", "run.warmup=false"]
    first = run_py(job, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    records = (tmp_path / "samples.jsonl").read_text().splitlines(keepends=True)
    assert len(records) == 2
    (tmp_path / "samples.jsonl").write_text(records[0])  # the time limit struck during the second prompt
    (tmp_path / "summary.json").unlink()
    again = run_py(job, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = (tmp_path / "samples.jsonl").read_text().splitlines(keepends=True)
    assert resumed[0] == records[0] and len(resumed) == 2  # kept byte for byte, the second prompt rerun
    assert json.loads(resumed[1])["id"] == json.loads(records[1])["id"]
    assert (tmp_path / "summary.json").exists()


def submitit_task(folder):
    """The process submitit's local controller started for the job (`python -m submitit.core._submit <folder>`)."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "submitit.core._submit" in cmdline and any(str(folder) in part for part in cmdline):
            return process
    return None


def wait_for(condition, what: str, timeout_s: float = 240):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout_s:.0f} s for {what}")


def test_a_job_submitit_requeues_after_sigterm_resumes_its_records_at_once(tmp_path):
    """SLURM's end of a job, through submitit's own machinery (its local executor, which relaunches a job that
    asks to be requeued as SLURM does): SIGTERM first, which submitit answers by carrying on (the run must not
    die of it, nor lose its lock to it), then the USR2 that SLURM sends before the time limit, on which
    submitit checkpoints Hydra's job and requeues it. The requeued job starts in the same folder, is not refused
    by the lock the first one held, keeps every record the first one wrote byte for byte, and runs only the
    prompts still missing."""
    import signal

    psutil = pytest.importorskip("psutil")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    # the embedded model at 48 tokens: about a second a prompt, time enough to signal between two records
    job = ["experiment=smoke", "model=smollm2_135m", "run.num_prompts=4", "run.max_new_tokens=48"]
    sweep = subprocess.Popen(
        [sys.executable, "run.py", "-m", *job, "hardware=cpu_plain", "run.warmup=false"]
        + ["hydra/launcher=submitit_local", f"run.out_dir={tmp_path}"],
        cwd=ROOT,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        records = lambda: [p for p in tmp_path.glob("0_*/samples.jsonl") if p.read_text().count("\n") >= 1]  # noqa: E731
        samples = wait_for(records, "the job's first record")[0]
        task = submitit_task(tmp_path)
        assert task is not None, "no submitit task process found"
        first_pid = task.pid
        task.send_signal(signal.SIGTERM)
        log_err = next(tmp_path.glob(".submitit/*/*_0_log.err"))
        answered = lambda: "Bypassing signal SIGTERM" in log_err.read_text() or not task.is_running()  # noqa: E731
        wait_for(answered, "submitit to answer SIGTERM", timeout_s=60)
        assert task.is_running() and (samples.parent / ".lock").exists()  # still running, still its folder's
        before = samples.read_text()
        task.send_signal(signal.SIGUSR2)
        output, _ = sweep.communicate(timeout=300)
    finally:
        sweep.kill() if sweep.poll() is None else None
    assert sweep.returncode == 0, output[-3000:]
    logs = "".join(p.read_text() for p in tmp_path.glob(".submitit/*/*_0_log.*"))
    assert "this job is preempted" in logs and "Requeued job" in logs, logs[-3000:]
    assert "Loading pickle" in logs.split("Requeued job", 1)[1]  # a second task ran the checkpointed job
    kept = before.splitlines(keepends=True)
    after = samples.read_text().splitlines(keepends=True)
    assert 1 <= len(kept) < 4 and after[: len(kept)] == kept and len(after) == 4, after  # nothing rewritten
    assert len({json.loads(line)["id"] for line in after}) == 4
    assert json.loads((samples.parent / "summary.json").read_text())["complete"]
    assert not (samples.parent / ".lock").exists()
    assert submitit_task(tmp_path) is None and not psutil.pid_exists(first_pid)
