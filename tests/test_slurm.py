"""The SLURM launcher (configs/hydra/launcher/graft_slurm.yaml): every job of every experiment is asked for the
GPUs its model needs, a sweep that would ask otherwise is refused before submitting, and a failed job exits
non-zero under SLURM while a local sweep goes on past it and names it at the end."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from graft.config import CONFIG_DIR, group_options, prepare_overrides, register_schemas
from graft.hardware import register_resolvers

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher (the slurm extra) is not installed"
)


def model_needs(model: str) -> int:
    """H200s a model needs: Qwen3-235B-A22B's bfloat16 weights are 470 GB, every other model here fits one."""
    return {"qwen3_235b": 4, "llama33_70b": 2}.get(model, 1)


def launcher_and_jobs(overrides: list[str]):
    """The SLURM launcher as Hydra instantiates it for `python run.py -m <overrides> hydra/launcher=graft_slurm`
    (its parameters resolved in the sweep's primary config, as submitit sends them), and every job's
    (overrides, model, GPUs) from graft.sweeps.gpus_per_job, which composes each job as the job does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext

    from graft.sweeps import gpus_per_job

    register_schemas()
    register_resolvers()  # ${gpus_needed:}, as run.py registers it
    setup_globals()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=prepare_overrides([*overrides, "hydra/launcher=graft_slurm"]), return_hydra_config=True
        )
        loader = GlobalHydra.instance().config_loader()
        context = HydraContext(config_loader=loader, callbacks=None)
        launcher = Plugins.instance().instantiate_launcher(hydra_context=context, task_function=None, config=cfg)
        return launcher, gpus_per_job(cfg, loader)


PAPER_JOBS = {"paper_short": 3 * 5 * 2, "paper_large": 5 * 2, "paper_long": 2, "paper_dflash": 5}


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_job_of_every_experiment_asks_for_its_models_gpus(experiment):
    launcher, jobs = launcher_and_jobs([f"experiment={experiment}"])
    assert type(launcher).__name__ == "SlurmLauncher" and launcher.params["timeout_min"] > 0
    for overrides, model, gpus in jobs:
        assert launcher.params["gpus_per_node"] == gpus == model_needs(model), (overrides, model)
    assert len(jobs) == PAPER_JOBS.get(experiment, len(jobs))


def test_a_model_on_the_command_line_replaces_the_experiments_models():
    launcher, jobs = launcher_and_jobs(["experiment=paper_short", "model=qwen3_235b"])
    assert launcher.params["gpus_per_node"] == 4
    assert len(jobs) == 5 * 2 and {(model, gpus) for _, model, gpus in jobs} == {("qwen3_235b", 4)}


def test_a_sweep_whose_jobs_need_other_gpus_is_refused_before_submitting(tmp_path):
    done = run_py(
        ["-m", "experiment=paper_short", "model=llama31_8b,qwen3_235b", "hydra/launcher=graft_slurm"], tmp_path
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model=qwen3_235b needs 4" in done.stderr
    for model in ("llama31_8b", "qwen3_235b"):
        assert f"python run.py -m experiment=paper_short model={model} hydra/launcher=graft_slurm" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing submitted, not even the sweep's folder


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
