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

Mode (`choose_mode`, one printed line says which and why): disabled by `logger.mode=disabled`, WANDB_MODE=disabled
or WANDB_DISABLED; else WANDB_MODE=online|offline; else logger.mode=online|offline; else the `mode` that
`wandb offline` / `wandb online` leave in W&B's settings files; else (logger.mode=auto, the default) online when
the user is logged in (WANDB_API_KEY, an entry for the W&B host in ~/.netrc / $NETRC as `wandb login`
writes it, or an api_key in W&B's settings file), offline otherwise (upload later with the printed
`wandb sync` command).

The run's id is derived from the absolute run directory and the config hash (graft/records/writer.py), with
resume="allow": a job resumed in the same run.out_dir continues its W&B run. Its name is
model/job_type/dataset plus every key overridden on the command line or by a sweep (Hydra's task
overrides), so two points of a sweep never share a name.
"""

from __future__ import annotations

import configparser
import hashlib
import netrc
import os
import re
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from graft.config.experiment import LoggerConfig

SAMPLE_COLUMNS = ["id", "category", "method", "turns", "tau", "tokens_per_s", "speedup_wall", "lossless"]
INTERVAL_COLUMNS = ["method", "category", "metric", "value", "low", "high", "n"]
ARTIFACT_TYPE = "run-records"
RECORD_FILES = ("samples.jsonl", "summary.json", "run.json")
TABLE_SUFFIXES = (".csv", ".tsv", ".md", ".tex")
DEFAULT_HOST = "https://api.wandb.ai"
STEP_METRIC = "prompt_index"  # the x axis of the per-prompt keys (WandbLogger._define_metrics)
SAMPLE_NAMESPACES = ("sample", "running")
# overrides that the name already shows (model/method/dataset), that group runs (experiment, logger), or that a
# resumed job may change (graft/records/writer.py RESUMABLE_KEYS): the run name and its artifact stay the same
NAME_SKIPPED = {
    "model",
    "method",
    "dataset",
    "experiment",
    "logger",
    "run.out_dir",
    "run.num_prompts",
    "run.progress",
    "dataset.num_prompts",
    "paths.data_root",
    "run.skip_memory_check",
    "run.repeats",
}


class NullLogger:
    def log_sample(self, record: dict, summary: dict, prefix: str = "") -> None:
        pass

    def finish(self, summary: dict, samples: list[dict] = (), figures: list[Path] = (), failed: bool = False) -> None:
        pass


# --- which mode, and why ---------------------------------------------------------------------------------


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def settings_files(env=None, cwd: str | Path | None = None) -> list[Path]:
    """W&B's settings files, the global one first: $WANDB_CONFIG_DIR/settings (else ~/.config/wandb/settings),
    then the workspace's ./wandb/settings (which `wandb offline` / `wandb online` may also write)."""
    env = os.environ if env is None else env
    config_dir = env.get("WANDB_CONFIG_DIR")
    global_file = Path(config_dir) / "settings" if config_dir else Path("~/.config/wandb/settings").expanduser()
    return [global_file, Path(cwd or os.getcwd()) / "wandb" / "settings"]


def wandb_settings(env=None, cwd: str | Path | None = None) -> dict[str, tuple[str, Path]]:
    """{key: (value, file)} of the [default] sections of W&B's settings files (the workspace's win)."""
    found: dict[str, tuple[str, Path]] = {}
    for path in settings_files(env, cwd):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        if parser.has_section("default"):
            found.update({key: (value, path) for key, value in parser.items("default")})
    return found


def netrc_path(env=None) -> Path:
    """The netrc file W&B reads: $NETRC, else ~/.netrc (or ~/_netrc where only that exists)."""
    env = os.environ if env is None else env
    if env.get("NETRC"):
        return Path(env["NETRC"]).expanduser()
    home = Path(env.get("HOME") or Path.home())
    unix, windows = home / ".netrc", home / "_netrc"
    return windows if windows.exists() and not unix.exists() else unix


def wandb_host(env=None, cwd: str | Path | None = None) -> str:
    """The W&B server: $WANDB_BASE_URL, else the settings files' base_url, else api.wandb.ai."""
    env = os.environ if env is None else env
    settings = wandb_settings(env, cwd)
    url = env.get("WANDB_BASE_URL") or settings.get("base_url", (DEFAULT_HOST,))[0]
    return urlsplit(url).netloc or url


def login_source(env=None, cwd: str | Path | None = None) -> str | None:
    """Where W&B would find this user's credentials (a phrase for the mode's line), or None when not logged in.
    Read offline, as `wandb login` leaves them: nothing is verified against the server."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return "WANDB_API_KEY is set"
    if env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE is set"
    host = wandb_host(env, cwd)
    path = netrc_path(env)
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry and entry[2]:
        return f"an API key for {host} in {path}"
    settings = wandb_settings(env, cwd)
    if settings.get("api_key", ("",))[0]:
        return f"an API key in {settings['api_key'][1]}"
    return None


def choose_mode(cfg_mode: str = "auto", env=None, cwd: str | Path | None = None) -> tuple[str, str]:
    """(online | offline | disabled, why). Turning logging off always wins; then the environment's WANDB_MODE,
    then logger.mode, then the settings files' mode (`wandb offline`), then whether the user is logged in."""
    env = os.environ if env is None else env
    variable = (env.get("WANDB_MODE") or "").strip().lower()
    variable = {"dryrun": "offline", "run": "online"}.get(variable, variable)
    if cfg_mode == "disabled":
        return "disabled", "logger.mode=disabled"
    if variable == "disabled":
        return "disabled", "WANDB_MODE=disabled"
    if _truthy(env.get("WANDB_DISABLED")):
        return "disabled", "WANDB_DISABLED is set"
    if variable in ("online", "offline"):
        return variable, f"WANDB_MODE={variable}"
    if cfg_mode in ("online", "offline"):
        return cfg_mode, f"logger.mode={cfg_mode}"
    settings = wandb_settings(env, cwd)
    if "mode" in settings:
        value, path = settings["mode"]
        value = {"dryrun": "offline", "run": "online"}.get(value.strip().lower(), value.strip().lower())
        if value in ("online", "offline", "disabled"):
            return value, f"mode = {value} in {path} (`wandb online` clears it)"
    source = login_source(env, cwd)
    if source:
        return "online", f"logged in: {source}"
    host = wandb_host(env, cwd)
    return (
        "offline",
        f"not logged in (no WANDB_API_KEY, no {host} entry in {netrc_path(env)}); `wandb login` to log online",
    )


# --- names and ids -----------------------------------------------------------------------------------------


def task_overrides() -> list[str] | None:
    """This job's command-line and sweep overrides (Hydra's `overrides.task`), or None outside a Hydra job."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        return list(HydraConfig.get().overrides.task)
    except Exception:  # no Hydra, or a config without the hydra node
        return None


def override_items(overrides: list[str] | None) -> list[str]:
    """`key=value` of each override the name should carry, sorted; a key is shortened to its last
    part (run.temperature -> temperature) unless two kept keys share that part."""
    kept = {}
    for override in overrides or ():
        if "=" not in override:
            continue
        key, value = override.split("=", 1)
        key = key.lstrip("+~").strip()
        if key in NAME_SKIPPED or key.startswith(("hydra.", "logger.")) or key == "hydra":
            continue
        if key == "methods" and value.strip() in ("null", "None", ""):
            continue  # run.py's marker of a single-method run: the name already shows the method
        kept[key] = value.strip()
    short = [key.rsplit(".", 1)[-1] for key in kept]
    return sorted(
        f"{key.rsplit('.', 1)[-1] if short.count(key.rsplit('.', 1)[-1]) == 1 else key}={value}"
        for key, value in kept.items()
    )


def sweep_group() -> str | None:
    """The W&B group of a Hydra multirun job: its sweep folder (one group per sweep; rerunning the same sweep to
    resume it keeps the group), or None outside a sweep."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
            return None
        folder = str(HydraConfig.get().sweep.dir)
    except Exception:  # no Hydra, or a config without the hydra node
        return None
    return folder if len(folder) <= 128 else f"{folder[:110]}-{hashlib.sha256(folder.encode()).hexdigest()[:8]}"


def run_tags(model: str, dataset: str, hardware: dict | None = None) -> list[str]:
    """The W&B tags that say what ran where: `model:<name>`, `dataset:<name>`, `hardware:<GPU or CPU>` (W&B keeps
    a tag to 64 characters)."""
    from graft.records.reader import hardware_name

    where = hardware_name(hardware or {}) or (hardware or {}).get("device")
    tags = [f"model:{model}", f"dataset:{dataset}"] + ([f"hardware:{where}"] if where else [])
    return [tag[:64] for tag in tags]


def logged_config(resolved: dict, methods: dict[str, dict], provenance: dict | None, comparison: bool) -> dict:
    """The W&B run's config: the resolved config, a comparison's `methods` as {name: every setting, defaults
    resolved} in place of the list of names and its unused default `method` left out, and run.json's provenance."""
    config = dict(resolved)
    if comparison:
        config.pop("method", None)
        config["methods"] = methods
    if provenance is not None:
        config["provenance"] = provenance
    return config


def run_name(resolved: dict, job_type: str, overrides: list[str] | None = None) -> str:
    """model/job_type/dataset, then the overridden keys: `tiny_llama/compare/builtin/temperature=0.7,total_tokens=30`."""
    model = (resolved.get("model") or {}).get("name", "model")
    dataset = (resolved.get("dataset") or {}).get("name", "dataset")
    name = f"{model}/{job_type}/{dataset}"
    items = override_items(overrides)
    return f"{name}/{','.join(items)}" if items else name


def artifact_name(name: str) -> str:
    """A W&B artifact name (letters, digits, `-`, `_`, `.`; at most 128) for a run name; a shortened one keeps a
    hash of the whole so two long names stay apart."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"
    if len(clean) > 128:
        clean = f"{clean[:119].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return clean


def run_id(resolved: dict, out_dir: str | Path) -> str:
    """W&B run id of a run directory: the same folder with the same config (graft/records/writer.py config_hash, which
    leaves out the logger and the keys a resumed job may change) gives the same id."""
    from graft.records.writer import config_hash

    where = str(Path(out_dir).expanduser().resolve())
    return hashlib.sha256(f"{where}\n{config_hash(resolved)}".encode()).hexdigest()[:24]


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
            warnings.warn(f"W&B could not start online ({err}); logging offline instead")
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
            warnings.warn(f"W&B: could not log {what} ({type(err).__name__}: {err})")

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
    `task_overrides`), carried by the W&B run's name; `config`: the W&B config (default `resolved`; runner.py
    passes `logged_config`); `tags`: before `logger.tags` (runner.py passes `run_tags`)."""
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
        warnings.warn(f"W&B logger could not start ({err}); continuing without it")
        return NullLogger()
