"""Sweeps that survive their failures. Hydra's local launcher stops a sweep at the first job that raises,
so a job that fails records why in `failed.json` in its own folder and returns; when the sweep ends,
`FailedJobs` names every failed job and exits non-zero. A rerun of the sweep skips the finished jobs and
retries the failed ones (their failed.json is removed when they start again). Under SLURM each job is its
own process and exits non-zero instead (`submitted_to_slurm`), so SLURM records it as failed.

`SlurmGpus` keeps a SLURM sweep from asking a job for fewer (or more) GPUs, or less memory, than its model needs."""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from pathlib import Path

from hydra.experimental.callback import Callback

FAILED = "failed.json"


def clear_failure(job_dir: str | Path) -> None:
    (Path(job_dir) / FAILED).unlink(missing_ok=True)


def record_failure(job_dir: str | Path, err: BaseException) -> Path:
    path = Path(job_dir) / FAILED
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = traceback.format_exception(type(err), err, err.__traceback__)
    path.write_text(json.dumps({"error": f"{type(err).__name__}: {err}", "traceback": lines[-12:]}, indent=2))
    return path


def failed_jobs(sweep_dir: str | Path) -> list[tuple[Path, str]]:
    return [(p.parent, json.loads(p.read_text())["error"]) for p in sorted(Path(sweep_dir).rglob(FAILED))]


def submitted_to_slurm() -> bool:
    """This process is a job the submitit launcher sent to SLURM (its sbatch script exports this). Not merely
    SLURM_JOB_ID: a local sweep run inside an allocation must still go on past a failed job."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


class FailedJobs(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        failed = failed_jobs(config.hydra.sweep.dir)
        if not failed:
            return
        print(
            f"\n{len(failed)} job(s) of the sweep failed (the others ran); rerun the same command to retry them:",
            file=sys.stderr,
        )
        for job_dir, error in failed:
            print(f"  {job_dir}: {error.splitlines()[0][:300]}", file=sys.stderr)
        sys.exit(1)


def sweep_jobs(config, loader) -> list[list[str]]:
    """Every job's overrides, made as Hydra's basic sweeper makes them: its params, then the command line's
    overrides (a key given on both takes the command line's values)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *config.hydra.overrides.task])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


GPU_REQUEST = ("gres", "constraint", "gpus_per_node")  # what a job asks SLURM for in GPUs


def gpu_request(launcher) -> str:
    """The GPUs a launcher config asks for, as one comparable text: "gres=gpu:h200:4"."""
    return " ".join(f"{key}={launcher[key]}" for key in GPU_REQUEST if launcher.get(key) is not None)


def job_requests(config, loader) -> list[tuple[list[str], str, str, int]]:
    """(overrides, model name, GPU request, mem_gb) of every job of the sweep whose primary config is `config`:
    the launcher's parameters resolved in the job's own config, composed as the job composes it."""
    from omegaconf.errors import InterpolationResolutionError

    from graft.schema import ConfigError

    jobs = []
    for overrides in sweep_jobs(config, loader):
        job = loader.load_sweep_config(config, overrides)
        launcher = job.hydra.launcher
        try:
            jobs.append((overrides, job.model.name, gpu_request(launcher), launcher.mem_gb))
        except InterpolationResolutionError as err:  # a job its plan refuses (a run.batch_size no GPU holds)
            cause = err
            while cause.__context__ is not None and not isinstance(cause, ConfigError):
                cause = cause.__context__  # OmegaConf wraps the resolver's ConfigError
            raise ConfigError(f"job {' '.join(overrides)}: {str(cause).splitlines()[0]}") from err
    return jobs


class SlurmGpus(Callback):
    """Submitit resolves the launcher's parameters once, in the sweep's primary config, so every job asks for
    the GPUs and memory of the model named there, not of its own (a model the experiment sweeps is not in that
    config). A sweep with a job that needs other GPUs is refused before anything is submitted, with one command
    per model; each of those has its model in the primary config. Memory is raised to the most any job needs
    (more host RAM than a job uses costs little; less kills it). A job whose plan refuses it (a run.batch_size
    that no GPU of the type holds: a batched run decodes on one) refuses the sweep, naming the job."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from omegaconf import open_dict

        from graft.schema import ConfigError

        asked = gpu_request(config.hydra.launcher)
        try:
            jobs = job_requests(config, GlobalHydra.instance().config_loader())
        except ConfigError as err:  # Hydra would only warn about a callback's exception, then submit
            print(f"error: {err} Nothing was submitted.", file=sys.stderr)
            sys.exit(2)
        wrong = {model: gpus for _, model, gpus, _ in jobs if gpus != asked}
        if wrong:
            refuse(config, asked, wrong, [model for _, model, _, _ in jobs])
        with open_dict(config):  # the launcher is made from this config after the callbacks ran
            config.hydra.launcher.mem_gb = max([config.hydra.launcher.mem_gb, *(mem for *_, mem in jobs)])


def refuse(config, asked: str, wrong: dict[str, str], models: list[str]) -> None:
    needs = ", ".join(f"model={model} needs {gpus}" for model, gpus in wrong.items())
    print(
        f"error: the SLURM launcher would ask every job of this sweep for {asked} (the GPUs of "
        f"model={config.model.name}), but {needs}. Submit one sweep per model:",
        file=sys.stderr,
    )
    for command in per_model_commands(config, models):
        print(f"  {command}", file=sys.stderr)
    sys.exit(2)


def per_model_commands(config, models: list[str]) -> list[str]:
    """The command line of this sweep once per model, the model given on the command line."""
    task = [o for o in config.hydra.overrides.task if not o.lstrip("+~").startswith("model=")]
    hydra = [o for o in config.hydra.overrides.hydra if not o.startswith("hydra.mode=")]
    return [shlex.join(["python", "run.py", "-m", *task, f"model={m}", *hydra]) for m in dict.fromkeys(models)]
