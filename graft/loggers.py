"""Experiment loggers: `none`, or Weights & Biases (offline by default; no network is needed).

One W&B run per job: grouped by experiment, job_type = the method (or "compare"), the resolved config as
the run's config, per-prompt figures as it goes, and at the end the summaries as the run summary, a
per-sample table and the run's figures. Offline runs print the `wandb sync` command. The run is always
finished, also when the job fails. A logger failure never loses results: they are already on disk.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from graft.config import LoggerConfig

SAMPLE_COLUMNS = ["id", "category", "method", "turns", "tau", "tokens_per_s", "speedup_wall", "lossless"]


class NullLogger:
    def log_sample(self, record: dict, summary: dict, prefix: str = "") -> None:
        pass

    def finish(self, summary: dict, samples: list[dict] = (), figures: list[Path] = (), failed: bool = False) -> None:
        pass


def sample_rows(records: list[dict]) -> list[list]:
    """One row per (prompt, method) in SAMPLE_COLUMNS order, for a comparison or a single run."""
    rows = []
    for record in records:
        if record.get("status") != "ok":
            continue
        entries = record["methods"].items() if "methods" in record else [(record.get("_method", "method"), record)]
        for name, entry in entries:
            side = entry["side"] if "side" in entry else entry["method"]
            totals = side["totals"]
            tau = totals["step_tokens"] / totals["steps"] if totals["steps"] else None
            rows.append(
                [
                    record["id"],
                    record.get("category"),
                    name,
                    record.get("turns"),
                    tau,
                    totals["tokens_per_s"],
                    entry["speedup_wall"],
                    entry["lossless"]["equal"],
                ]
            )
    return rows


def flat_summary(summary: dict) -> dict:
    """Scalars of a summary; a comparison's rows as `<method>/<metric>`."""
    flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, bool, str)) or v is None}
    for name, row in (summary.get("rows") or {}).items():
        flat.update({f"{name}/{k}": v for k, v in row.items() if isinstance(v, (int, float, bool)) or v is None})
    return flat


class WandbLogger(NullLogger):
    def __init__(self, cfg: LoggerConfig, resolved: dict, out_dir: str, job_type: str, group: str):
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        self.offline = (
            cfg.mode == "offline" or os.environ.get("WANDB_MODE") == "offline" or not os.environ.get("WANDB_API_KEY")
        )
        mode = "offline" if self.offline else cfg.mode  # make_logger never builds a disabled one
        self.run = wandb.init(
            project=cfg.project,
            mode=mode,
            dir=cfg.dir or out_dir,
            config=resolved,
            name=f"{resolved['model']['name']}/{job_type}/{resolved['dataset']['name']}",
            group=cfg.group or group,
            job_type=job_type,
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

    def finish(self, summary: dict, samples: list[dict] = (), figures: list[Path] = (), failed: bool = False) -> None:
        try:
            self.run.summary.update(flat_summary(summary))
            rows = sample_rows(list(samples))
            if rows:
                self.run.log({"samples": self._wandb.Table(columns=SAMPLE_COLUMNS, data=rows)})
            for figure in figures:
                self.run.log({f"figures/{Path(figure).stem}": self._wandb.Image(str(figure))})
        finally:
            self.run.finish(exit_code=1 if failed else 0)
            if self.offline:
                print(f"W&B run logged offline; upload it with: wandb sync {self.run.dir.rsplit('/files', 1)[0]}")


def make_logger(cfg: LoggerConfig, resolved: dict, out_dir: str, job_type: str = "run", group: str | None = None):
    if cfg.name == "none" or cfg.mode == "disabled" or os.environ.get("WANDB_MODE") == "disabled":
        return NullLogger()
    try:
        return WandbLogger(cfg, resolved, out_dir, job_type, group or job_type)
    except Exception as err:  # a logging backend must not stop a benchmark
        warnings.warn(f"W&B logger could not start ({err}); continuing without it")
        return NullLogger()
