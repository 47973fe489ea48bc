"""Experiment loggers: `none`, or Weights & Biases.

One W&B run per job, job_type = the method (or "compare"), grouped by `logger.group`, else by the sweep (Hydra's
multirun sweep folder), else by the experiment. Its config is the resolved config with every compared method's
settings under `methods` (a comparison's, not the default `method`) and run.json's `provenance`; its tags name the
model, the dataset and the hardware (`model:...`, `dataset:...`, `hardware:...`, then `logger.tags`). Per-prompt
figures as it goes, under `sample/<method>/...` and `running/<method>/...` against the step metric `prompt_index`
(the prompt's place in the run, so a resumed job's prompts land where they belong whatever W&B's own step has
reached); at the end the summaries as the run summary, the per-sample table and the per-category table of the 95%
intervals (`tables/samples`, `tables/intervals`), the run's figures (`figures/...`), and the run's records
(samples.jsonl, summary.json, run.json, per-method summaries, tables) as one artifact of type "run-records".
The run is always finished, also when the job fails. A logger failure never loses results: they are already
on disk.

Which mode it logs in: graft/run/wandb_mode.py; the run's name, id, group, tags and config:
graft/run/wandb_naming.py.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from graft.config.schema import LoggerConfig
from graft.run.wandb_mode import choose_mode
from graft.run.wandb_naming import artifact_name, run_id, run_name

SAMPLE_COLUMNS = ["id", "category", "method", "turns", "tau", "tokens_per_s", "speedup_wall", "lossless"]
INTERVAL_COLUMNS = ["method", "category", "metric", "value", "low", "high", "n"]
ARTIFACT_TYPE = "run-records"
RECORD_FILES = ("samples.jsonl", "summary.json", "run.json")
TABLE_SUFFIXES = (".csv", ".tsv", ".md", ".tex")
STEP_METRIC = "prompt_index"  # the x axis of the per-prompt keys (WandbLogger._define_metrics)
SAMPLE_NAMESPACES = ("sample", "running")


class NullLogger:
    def log_sample(self, record: dict, summary: dict, prefix: str = "") -> None:
        pass

    def finish(self, summary: dict, samples: list[dict] = (), figures: list[Path] = (), failed: bool = False) -> None:
        pass


# --- what is logged ----------------------------------------------------------------------------------------


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


def interval_rows(intervals: dict) -> list[list]:
    """One row per (method, category, metric) in INTERVAL_COLUMNS order; category "all" is the whole run."""
    from graft.analysis.stats import interval_entries

    return [
        [method, category, metric, *(entry.get(k) for k in ("value", "low", "high", "n"))]
        for method, category, metric, entry in interval_entries(intervals)
    ]


def flat_summary(summary: dict, intervals: dict | None = None) -> dict:
    """Scalars of a summary; a comparison's rows as `<method>/<metric>`; each method's whole-run intervals as
    `<method>/<metric>_low` and `_high`."""
    flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, bool, str)) or v is None}
    for name, row in (summary.get("rows") or {}).items():
        flat.update({f"{name}/{k}": v for k, v in row.items() if isinstance(v, (int, float, bool)) or v is None})
    for name, spread in (intervals or {}).items():
        for metric, entry in (spread.get("all") or {}).items():
            flat.update({f"{name}/{metric}_{k}": entry.get(k) for k in ("low", "high")})
    return flat


def record_files(out_dir: str | Path, figures: list[Path] = ()) -> dict[str, Path]:
    """{name in the artifact: file} of a run's records: samples.jsonl, summary.json, run.json, the per-method
    summaries, tables (.csv/.tsv/.md/.tex) in the folder or its tables/, and the figures."""
    root = Path(out_dir)
    files = {name: root / name for name in RECORD_FILES if (root / name).is_file()}
    for path in sorted((root / "summaries").glob("*.json")):
        files[f"summaries/{path.name}"] = path
    for path in sorted([*root.glob("*"), *(root / "tables").rglob("*")]):
        if path.is_file() and path.suffix in TABLE_SUFFIXES:
            files[path.relative_to(root).as_posix()] = path
    for figure in figures:
        path = Path(figure)
        if path.is_file():
            inside = path.resolve().is_relative_to(root.resolve())
            files[path.resolve().relative_to(root.resolve()).as_posix() if inside else f"figures/{path.name}"] = path
    return files


class WandbLogger(NullLogger):
    def __init__(
        self,
        cfg: LoggerConfig,
        resolved: dict,
        out_dir: str,
        job_type: str,
        group: str,
        mode: str = "offline",
        overrides: list[str] | None = None,
        config: dict | None = None,
        tags: list[str] | None = None,
    ):
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        self.out_dir = Path(out_dir)
        self.name = run_name(resolved, job_type, overrides)
        self.id = run_id(resolved, out_dir)
        options = dict(
            project=cfg.project,
            dir=cfg.dir or out_dir,
            config=resolved if config is None else config,
            name=self.name,
            id=self.id,
            resume="allow",
            group=cfg.group or group,
            job_type=job_type,
            tags=list(dict.fromkeys([*(tags or []), *cfg.tags])),
            reinit="finish_previous",
        )
        Path(options["dir"]).mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(mode=mode, **options)
        except Exception as err:
            if mode != "online":
                raise
            warnings.warn(f"W&B could not start online ({err}); logging offline instead", stacklevel=2)
            mode = "offline"
            self.run = wandb.init(mode=mode, **options)
        self.offline = mode == "offline"
        self._try("the step metric", self._define_metrics)

    def _define_metrics(self) -> None:
        """Per-prompt keys against `prompt_index`, not W&B's own step: a resumed run's step counter has moved on
        (the tables and figures logged at the end advance it), so an explicit step would be refused as stale."""
        self.run.define_metric(STEP_METRIC, hidden=True)
        for namespace in SAMPLE_NAMESPACES:
            self.run.define_metric(f"{namespace}/*", step_metric=STEP_METRIC)

    def log_sample(self, record: dict, summary: dict, prefix: str = "") -> None:
        """One prompt's figures, `sample/<method>/...` and `running/<method>/...` (`prefix`: "<method>/" in a
        comparison, else the run's method) at `prompt_index` = the record's index."""
        if record.get("status") != "ok":
            return
        name = prefix.rstrip("/") or str(summary.get("method") or "method")
        totals = record["method"]["totals"]
        self.run.log(
            {
                STEP_METRIC: record["index"],
                f"sample/{name}/tau": totals["step_tokens"] / totals["steps"] if totals["steps"] else None,
                f"sample/{name}/tokens_per_s": totals["tokens_per_s"],
                f"sample/{name}/speedup_wall": record["speedup_wall"],
                f"sample/{name}/lossless": record["lossless"]["equal"],
                f"running/{name}/tau": summary["tau"],
                f"running/{name}/speedup_wall": summary["speedup_wall"],
            }
        )

    def _try(self, what: str, action) -> None:
        """One part of the final logging; its failure is a warning, and the parts after it still run."""
        try:
            action()
        except Exception as err:
            warnings.warn(f"W&B: could not log {what} ({type(err).__name__}: {err})", stacklevel=2)

    def finish(self, summary: dict, samples: list[dict] = (), figures: list[Path] = (), failed: bool = False) -> None:
        samples = list(samples)
        try:
            spread: dict = {}

            def intervals() -> None:
                from graft.analysis.stats import summary_intervals

                spread.update(summary_intervals(summary, samples))
                rows = interval_rows(spread)
                if rows:
                    self.run.log({"tables/intervals": self._wandb.Table(columns=INTERVAL_COLUMNS, data=rows)})

            def table() -> None:
                rows = sample_rows(samples)
                if rows:
                    self.run.log({"tables/samples": self._wandb.Table(columns=SAMPLE_COLUMNS, data=rows)})

            def images() -> None:
                for figure in figures:
                    self.run.log({f"figures/{Path(figure).stem}": self._wandb.Image(str(figure))})

            def artifact() -> None:
                files = record_files(self.out_dir, figures)
                if not files:
                    return
                records = self._wandb.Artifact(
                    artifact_name(self.name),
                    type=ARTIFACT_TYPE,
                    description=f"graft run records of {self.name} ({self.out_dir})",
                    metadata={
                        "run_name": self.name,
                        "out_dir": str(self.out_dir.resolve()),
                        "records": sum(1 for r in samples if r.get("status") == "ok"),
                        "failed": failed,
                    },
                )
                for name, path in files.items():
                    records.add_file(str(path), name=name)
                self.run.log_artifact(records, aliases=["latest", *(["failed"] if failed else [])])

            self._try("the per-category intervals", intervals)
            self._try("the summary", lambda: self.run.summary.update(flat_summary(summary, spread)))
            self._try("the per-sample table", table)
            self._try("the figures", images)
            self._try("the run's records as an artifact", artifact)
        finally:
            self.run.finish(exit_code=1 if failed else 0)
            if self.offline:
                print(f"W&B run logged offline; upload it with: wandb sync {self.run.dir.rsplit('/files', 1)[0]}")


def make_logger(
    cfg: LoggerConfig,
    resolved: dict,
    out_dir: str,
    job_type: str = "run",
    group: str | None = None,
    overrides: list[str] | None = None,
    config: dict | None = None,
    tags: list[str] | None = None,
):
    """The job's logger. `overrides`: the job's `key=value` overrides (runner.py passes Hydra's, see
    wandb_naming.py `task_overrides`), carried by the W&B run's name; `config`: the W&B config (default `resolved`;
    runner.py passes `logged_config`); `tags`: before `logger.tags` (runner.py passes `run_tags`)."""
    if cfg.name == "none":
        return NullLogger()
    mode, why = choose_mode(cfg.mode)
    print(f"W&B: {mode} ({why})")
    if mode == "disabled":
        return NullLogger()
    try:
        return WandbLogger(
            cfg,
            resolved,
            out_dir,
            job_type,
            group or job_type,
            mode=mode,
            overrides=overrides,
            config=config,
            tags=tags,
        )
    except Exception as err:  # a logging backend must not stop a benchmark
        warnings.warn(f"W&B logger could not start ({err}); continuing without it", stacklevel=2)
        return NullLogger()
