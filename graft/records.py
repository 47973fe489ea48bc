"""Run directories: the resolved config, one JSON line per finished prompt, and the summary.

`samples.jsonl` is appended and flushed as each prompt finishes, so an interrupted run keeps what it
computed; rerunning with the same `run.out_dir` and the same config skips the finished prompts. A
different config in the same directory is refused, naming the keys that differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import warnings
from pathlib import Path

# Keys that do not change any prompt's result: they may differ between a run and its resumption.
RESUMABLE_KEYS = {
    ("run", "out_dir"),
    ("run", "num_prompts"),
    ("run", "progress"),
    ("dataset", "num_prompts"),
    ("paths", "data_root"),
}


class RunDirConflict(RuntimeError):
    pass


def _flatten(cfg: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def result_config(cfg: dict) -> dict:
    """The part of the config that determines results (logger and resumable keys removed)."""
    kept = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items() if k != "logger"}
    for section, key in RESUMABLE_KEYS:
        kept.get(section, {}).pop(key, None)
    return kept


def config_hash(cfg: dict) -> str:
    blob = json.dumps(result_config(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def token_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def hardware_info(device: str) -> dict:
    import torch
    import transformers

    info = {
        "device": device,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def completed_summary(path: str | Path, cfg: dict, plan: dict) -> dict | None:
    """The summary of a run directory that already finished this config and prompt plan, else None: a
    rerun of a sweep skips such jobs without loading the model."""
    path = Path(path)
    try:
        run = json.loads((path / "run.json").read_text())
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return summary if run.get("config_hash") == config_hash(cfg) and summary.get("complete") == plan else None


class RunDir:
    def __init__(self, path: str | Path, cfg: dict, meta: dict):
        self.path = Path(path)
        self.samples_path = self.path / "samples.jsonl"
        self.summary_path = self.path / "summary.json"
        self.run_path = self.path / "run.json"
        self.hash = config_hash(cfg)
        self.path.mkdir(parents=True, exist_ok=True)
        if self.run_path.exists():
            previous = json.loads(self.run_path.read_text())
            if previous.get("config_hash") != self.hash:
                raise RunDirConflict(self._conflict_message(previous.get("config", {}), cfg))
        else:
            record = {"config_hash": self.hash, "config": cfg, **meta}
            self.run_path.write_text(json.dumps(record, indent=2, default=str))

    def _conflict_message(self, old: dict, new: dict) -> str:
        old_flat, new_flat = _flatten(result_config(old)), _flatten(result_config(new))
        diffs = [
            f"  {key}: {old_flat.get(key, '<absent>')!r} there, {new_flat.get(key, '<absent>')!r} now"
            for key in sorted(set(old_flat) | set(new_flat))
            if old_flat.get(key) != new_flat.get(key)
        ]
        return (
            f"run.out_dir={self.path} holds results of a different config; refusing to mix them.\n"
            + "\n".join(diffs[:20])
            + "\nUse another run.out_dir, or rerun with the config recorded in its run.json."
        )

    def finished(self) -> list[dict]:
        """Records already written; a torn last line (from a killed run) is dropped with a warning."""
        if not self.samples_path.exists():
            return []
        records = []
        lines = self.samples_path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):
                    warnings.warn(
                        f"{self.samples_path}:{number} is incomplete (interrupted run); that prompt will rerun"
                    )
                    self._truncate_to(lines[: number - 1])
                else:
                    raise RunDirConflict(f"{self.samples_path}:{number} is not valid JSON; fix or move the file")
        return records

    def _truncate_to(self, lines: list[str]) -> None:
        self.samples_path.write_text("".join(line + "\n" for line in lines))

    def append(self, record: dict) -> None:
        with open(self.samples_path, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_summary(self, summary: dict) -> None:
        self.write_json("summary.json", summary)

    def write_json(self, name: str, data: dict) -> Path:
        """Write `name` (relative to the run directory) atomically: a reader never sees half a file."""
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(path)
        return path
