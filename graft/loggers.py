"""Experiment loggers: `none`, or Weights & Biases (offline by default; no network is needed).

A logger failure never loses results: they are already on disk in the run directory.
"""

from __future__ import annotations

import os
import warnings

from graft.config import LoggerConfig


class NullLogger:
    def log_sample(self, record: dict, summary: dict, prefix: str = "") -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


class WandbLogger(NullLogger):
    def __init__(self, cfg: LoggerConfig, resolved: dict, out_dir: str):
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        label = "compare" if resolved.get("methods") else resolved["method"]["name"]
        name = f"{resolved['model']['name']}/{label}/{resolved['dataset']['name']}"
        self.run = wandb.init(
            project=cfg.project,
            mode=cfg.mode,
            dir=cfg.dir or out_dir,
            config=resolved,
            name=name,
            tags=cfg.tags,
            reinit="finish_previous",
        )

    def log_sample(self, record: dict, summary: dict, prefix: str = "") -> None:
        """One prompt's figures; `prefix` names the method in a comparison (one step per prompt)."""
        if record.get("status") != "ok":
            return
        totals = record["method"]["totals"]
        self.run.log(
            {
                f"{prefix}sample/tau": totals["step_tokens"] / totals["steps"] if totals["steps"] else None,
                f"{prefix}sample/tokens_per_s": totals["tokens_per_s"],
                f"{prefix}sample/speedup_wall": record["speedup_wall"],
                f"{prefix}sample/lossless": record["lossless"]["equal"],
                f"{prefix}running/tau": summary["tau"],
                f"{prefix}running/speedup_wall": summary["speedup_wall"],
            },
            step=record["index"],
        )

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
