"""How a job's W&B run is named, identified, grouped, tagged and configured. Its id is derived from the absolute run
directory and the config hash (graft/records/writer.py), with resume="allow": a job resumed in the same run.out_dir
continues its W&B run. Its name is model/job_type/dataset plus every key overridden on the command line or by a
sweep (Hydra's task overrides), so two points of a sweep never share a name."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

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
