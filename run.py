"""Entry point: `python run.py [model=X] [method=Y] [dataset=Z] [run.key=value ...]` (Hydra)."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
# OpenMP workers spin between the many small ops of a decode step when the cores are ours, and sleep when
# another process is busy on them; decided before torch loads libgomp (graft/cpu/threads.py)
from graft.cpu.threads import choose_before_torch  # noqa: E402

choose_before_torch()

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from graft.config import ConfigError, check_overrides, register_schemas, validate  # noqa: E402
from graft.data import DatasetError  # noqa: E402
from graft.eagle.checkpoint import HeadLoadError  # noqa: E402
from graft.embedded import EmbeddedModelError  # noqa: E402
from graft.hardware import register_resolvers  # noqa: E402
from graft.models import ModelLoadError  # noqa: E402
from graft.records import RunDirConflict  # noqa: E402
from graft.sweeps import clear_failure, record_failure, submitted_to_slurm  # noqa: E402

USER_ERRORS = (ConfigError, ModelLoadError, RunDirConflict, EmbeddedModelError, DatasetError, HeadLoadError)
register_schemas()
register_resolvers()  # ${gpus_needed:}: the GPUs a scheduler asks for (graft/hardware.py)


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from graft.report import print_comparison, print_summary
    from graft.runner import run

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
        if sweeping:  # this job fails, the sweep goes on; graft.sweeps.FailedJobs names it at the end
            print(f"error: {err}", file=sys.stderr)
            record_failure(hydra_cfg.runtime.output_dir, err)
            if submitted_to_slurm():  # a SLURM job is its own process: SLURM marks it failed by its exit status
                sys.exit(1)
            return None
        if isinstance(err, USER_ERRORS):
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise
    if summary.get("kind") == "comparison":
        print_comparison(summary, typed.run.out_dir, time.perf_counter() - started)
        return None
    print_summary(summary, typed.run.out_dir)
    return summary.get("speedup_wall")


if __name__ == "__main__":
    try:
        sys.argv[1:] = check_overrides(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
