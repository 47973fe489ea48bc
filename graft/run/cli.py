"""`graft-run [model=X] [method=Y] [dataset=Z] [run.key=value ...]` (Hydra): one run or comparison, or a sweep
with `-m`. `python run.py ...` in a checkout is the same command.

The Hydra configs ship inside the package (graft/configs, graft.config.hydra_setup.CONFIG_DIR), so an installed copy
runs from any directory. Nothing here imports torch at module level: `main()` sets the OpenMP spin policy first
(graft/cpu/threads.py), since OpenMP reads it when torch loads libgomp.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path


def job(cfg) -> float | None:
    """Hydra's task function: validate the composed config, run it, print its summary."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from graft.analysis.console import print_comparison, print_summary
    from graft.config.experiment import validate
    from graft.run.commands import is_user_error
    from graft.run.logs import printed, to_log_file
    from graft.run.runner import run
    from graft.run.sweeps import clear_failure, record_failure, submitted_to_slurm

    started = time.perf_counter()
    hydra_cfg = HydraConfig.get()
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    if sweeping:
        clear_failure(hydra_cfg.runtime.output_dir)
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        typed = validate(resolved)
        summary = run(typed, resolved, experiment=hydra_cfg.runtime.choices.get("experiment"))
    except Exception as err:
        if sweeping:  # this job fails, the sweep goes on; graft.run.sweeps.FailedJobs names it at the end
            print(f"error: {err}", file=sys.stderr)
            to_log_file(f"error: {err}", logging.ERROR)  # stderr has it; the job's .log too
            record_failure(hydra_cfg.runtime.output_dir, err)
            if submitted_to_slurm():  # a SLURM job is its own process: SLURM marks it failed by its exit status
                sys.exit(1)
            return None
        if is_user_error(err):  # a config value or input file: one line, exit 2 (graft/run/commands.py)
            print(f"error: {err}", file=sys.stderr)
            to_log_file(f"error: {err}", logging.ERROR)
            sys.exit(2)
        raise
    if summary.get("kind") == "comparison":
        print_comparison(summary, typed.run.out_dir, wall := time.perf_counter() - started)
        to_log_file(printed(print_comparison, summary, typed.run.out_dir, wall))  # the job's .log keeps the table
        return None
    print_summary(summary, typed.run.out_dir)
    to_log_file(printed(print_summary, summary, typed.run.out_dir))
    return summary.get("speedup_wall")


def prepare() -> None:
    """What a run does before anything else: the OpenMP spin policy, decided before torch loads libgomp (OpenMP
    workers spin between the many small ops of a decode step when the cores are ours, and sleep when another
    process is busy on them; graft/cpu/threads.py), then the configs' schemas and resolvers."""
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    from graft.cpu.threads import choose_before_torch

    choose_before_torch()

    from graft.config.hydra_setup import register_schemas
    from graft.plan.hardware import register_resolvers

    register_schemas()
    register_resolvers()  # ${gpus_needed:}: the GPUs a scheduler asks for (graft/plan/hardware.py)


def make_run_dir(argv: list[str]) -> None:
    """The folder a single run writes to (hydra.run.dir, which run.out_dir sets), made now: Hydra makes it before
    the run starts and a folder that cannot be made (read-only, a file in the way) ended in its traceback."""
    if any(a in ("-m", "--multirun") or a.startswith("--multirun=") for a in argv):
        return  # a sweep's folders are made per job, under hydra.sweep.dir
    for arg in argv:
        if arg.startswith("hydra.run.dir=") and "${" not in arg:  # an interpolation is Hydra's to resolve
            folder = Path(arg.split("=", 1)[1].strip("'\"")).expanduser()
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                from graft.schema import ConfigError

                raise ConfigError(
                    f"{arg}: the run's folder cannot be made ({err.strerror or err}); choose another run.out_dir"
                ) from None


def main() -> None:
    """The `graft-run` console script (and run.py): overrides checked, then Hydra composes and runs `job`."""
    prepare()
    import hydra

    from graft.config.hydra_setup import CONFIG_DIR
    from graft.config.override_checks import check_overrides
    from graft.schema import ConfigError

    try:
        sys.argv[1:] = check_overrides(sys.argv[1:])
        make_run_dir(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    # the configs by absolute path: Hydra would otherwise look beside the file that defines the task function
    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")(job)()


if __name__ == "__main__":
    main()
