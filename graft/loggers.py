"""Experiment loggers: `none`, or Weights & Biases (offline by default; no network is needed).

A logger failure never loses results: they are already on disk in the run directory.
"""

from __future__ import annotations

import os
import warnings

from graft.config import LoggerConfig


class NullLogger:
    def log_sample(self, record: dict, summary: dict) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


class WandbLogger(NullLogger):
    def __init__(self, cfg: LoggerConfig, resolved: dict, out_dir: str):
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        name = f"{resolved['model']['name']}/{resolved['method']['name']}/{resolved['dataset']['name']}"
        self.run = wandb.init(
            project=cfg.project,
            mode=cfg.mode,
            dir=cfg.dir or out_dir,
            config=resolved,
            name=name,
            tags=cfg.tags,
            reinit="finish_previous",
        )
        self.step = 0

    def log_sample(self, record: dict, summary: dict) -> None:
        if record.get("status") != "ok":
            return
        totals = record["method"]["totals"]
        self.run.log(
            {
                "sample/tau": totals["step_tokens"] / totals["steps"] if totals["steps"] else None,
                "sample/tokens_per_s": totals["tokens_per_s"],
                "sample/speedup_wall": record["speedup_wall"],
                "sample/lossless": record["lossless"]["equal"],
                "running/tau": summary["tau"],
                "running/speedup_wall": summary["speedup_wall"],
            },
            step=self.step,
        )
        self.step += 1

    def finish(self, summary: dict) -> None:
        flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, bool, str)) or v is None}
        self.run.summary.update(flat)
        self.run.finish()


def make_logger(cfg: LoggerConfig, resolved: dict, out_dir: str):
    if cfg.name == "none" or cfg.mode == "disabled" or os.environ.get("WANDB_MODE") == "disabled":
        return NullLogger()
    try:
        return WandbLogger(cfg, resolved, out_dir)
    except Exception as err:  # a logging backend must not stop a benchmark
        warnings.warn(f"W&B logger could not start ({err}); continuing without it")
        return NullLogger()
