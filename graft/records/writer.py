"""Run directories: the resolved config, one JSON line per finished prompt, and the summary.

`samples.jsonl` is appended and flushed as each prompt finishes, so an interrupted run keeps what it
computed; rerunning with the same `run.out_dir` and the same config skips the finished prompts. A
different config in the same directory is refused, naming the keys that differ. One run writes a folder at a
time: opening it takes `.lock` (its holder's pid, host and start), which a second run is refused by and a
dead holder's run takes over (graft/records/folder.py: RunLock, with what the report tools read of a folder).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
from pathlib import Path

from graft.budget.profile import cpu_model
from graft.records.folder import (  # noqa: F401  (re-exported: what a run folder holds is read there)
    LOCK,
    RESUMABLE_KEYS,
    LockHeld,
    RunLock,
    _flatten,
    holder_text,
    live_holder,
    lock_holder,
    records_digest,
    records_problem,
    result_config,
)

log = logging.getLogger(__name__)


class RunDirConflict(RuntimeError):
    pass


def config_hash(cfg: dict) -> str:
    blob = json.dumps(result_config(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def token_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def _thread_policy() -> dict | None:
    from graft.cpu import threads

    policy = threads.CHOSEN
    spin = os.environ.get("GOMP_SPINCOUNT")
    return {**policy.as_record(), "reason": policy.reason} if policy else {"fixed": True, "GOMP_SPINCOUNT": spin}


def _huge_pages() -> dict:
    from graft.cpu.threads import HUGE_PAGES, huge_pages_mb

    return {"asked": os.environ.get(HUGE_PAGES) == "1", "in_use_mb": huge_pages_mb()}


def hardware_info(device: str, attention: str | None = None) -> dict:
    import torch
    import transformers

    info = {
        "device": device,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        # the vector instructions torch's CPU kernels (and graft/cpu/native's) use: one model name ("AMD EPYC")
        # can cover an AVX2 CPU and an AVX512 one, whose kernels run at very different speeds
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "thread_policy": _thread_policy(),
        "huge_pages": _huge_pages(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if attention:
        info["attention"] = attention
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)
        info["cuda"] = torch.version.cuda
        info["driver"] = _nvidia_driver()
        info["sdpa_kernels"] = [
            name
            for name, enabled in (
                ("flash", torch.backends.cuda.flash_sdp_enabled()),
                ("mem_efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
                ("cudnn", getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)()),
                ("math", torch.backends.cuda.math_sdp_enabled()),
            )
            if enabled
        ]
    return info


def peak_memory(devices) -> dict:
    """The process's peak memory so far in GB (1e9 bytes): the host's resident set and, on CUDA, the most
    the caching allocator held on each GPU."""
    import resource

    import torch

    peak = {"host_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 2)}  # KiB on Linux
    for device in devices:
        if device.type == "cuda":
            peak[f"{device}_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
    return peak


def _nvidia_driver() -> str | None:
    """The driver version from nvidia-smi, or None where it is not installed."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def completed_summary(path: str | Path, cfg: dict, plan: dict) -> dict | None:
    """The summary of a run directory that already finished this config and prompt plan, else None: a
    rerun of a sweep skips such jobs without loading the model. Complete means verified: the summary names
    the records it was computed from (their ids and digest), and samples.jsonl still holds exactly those,
    intact; anything less is resumed, with one line saying why."""
    path = Path(path)
    try:
        run = json.loads((path / "run.json").read_text())
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    complete = summary.get("complete")
    if run.get("config_hash") != config_hash(cfg) or not isinstance(complete, dict) or complete.get("plan") != plan:
        return None
    problem = _records_problem(path / "samples.jsonl", complete.get("ids", []), complete.get("records_sha1"))
    if problem:
        log.warning("%s: summary.json says complete, but %s; resuming", path, problem)
        return None
    return summary


def _records_problem(samples: Path, ids: list[str], digest: str | None) -> str | None:
    """Why samples.jsonl does not hold exactly one intact record per id of `ids` with this digest, or None."""
    try:
        lines = samples.read_text().splitlines()
    except OSError:
        return f"{samples.name} is missing"
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            return f"{samples.name}:{number} is torn"
    return records_problem(records, ids, digest)


class RunDir:
    """A run's folder. Opening it checks, before anything expensive, that it can be written and holds no
    other config's results; `start` writes run.json once the run really starts (the model loaded and the
    drafters built), so a run that fails to start leaves nothing that blocks its corrected rerun. Opening also
    takes the folder's lock (RunLock; `lock=False` reads without it): `close`, or leaving a `with` block, lets
    go of it."""

    def __init__(self, path: str | Path, cfg: dict, lock: bool = True):
        self.path = Path(path)
        self.samples_path = self.path / "samples.jsonl"
        self.summary_path = self.path / "summary.json"
        self.run_path = self.path / "run.json"
        self.cfg = cfg
        self.hash = config_hash(cfg)
        if self.path.exists() and not self.path.is_dir():
            raise RunDirConflict(f"run.out_dir={self.path} is a file, not a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write_probe"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise RunDirConflict(f"run.out_dir={self.path} cannot be written ({err.strerror or err})") from None
        for existing in (self.samples_path, self.summary_path, self.run_path):  # appended to or replaced later
            if existing.is_dir():
                raise RunDirConflict(f"{existing} is a directory; a run writes a file there")
            if existing.exists():
                try:
                    existing.open("a").close()
                except OSError as err:
                    raise RunDirConflict(f"{existing} cannot be written ({err.strerror or err})") from None
        if self.run_path.exists():
            try:
                previous = json.loads(self.run_path.read_text())
            except json.JSONDecodeError:
                raise RunDirConflict(
                    f"{self.run_path} is not valid JSON (torn by a crash?); move it away to start this folder again"
                ) from None
            if previous.get("config_hash") != self.hash:
                raise RunDirConflict(self._conflict_message(previous.get("config", {}), cfg))
        self.lock = RunLock(self.path)
        if lock:
            try:
                self.lock.acquire()  # one writer: a second run into this folder is refused here, before any model loads
            except LockHeld as err:
                raise RunDirConflict(str(err)) from None

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, meta: dict) -> None:
        if not self.run_path.exists():
            self.write_json("run.json", {"config_hash": self.hash, "config": self.cfg, **meta})

    def update_run(self, meta: dict) -> None:
        """Add what is known only after the run (what compiling cost) to run.json."""
        self.write_json("run.json", {**json.loads(self.run_path.read_text()), **meta})

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
        """Records already written, one per prompt id. A torn last line (a killed run) is dropped and its
        prompt reruns; a prompt recorded twice keeps its last record; either way the file is rewritten."""
        if not self.samples_path.exists():
            return []
        records: dict[str, dict] = {}
        text = self.samples_path.read_text()
        lines = text.splitlines()
        intact = len(lines)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number != len(lines):
                    raise RunDirConflict(
                        f"{self.samples_path}:{number} is not valid JSON; fix or move the file"
                    ) from None
                log.warning("%s:%d is torn (an interrupted run); that prompt reruns", self.samples_path, number)
                intact = number - 1
                break
            records.pop(record.get("id"), None)  # a later record of the same prompt replaces the earlier
            records[record.get("id")] = record
        # rewritten when a line was dropped, or the last one lacks its newline (the next append would join it)
        unterminated = bool(text) and not text.endswith("\n")
        if unterminated or intact < len(lines) or len(records) < sum(1 for line in lines[:intact] if line.strip()):
            self._rewrite(list(records.values()))
        return list(records.values())

    def _rewrite(self, records: list[dict]) -> None:
        """samples.jsonl replaced whole (temporary file + rename): a crash leaves the old file or the new."""
        tmp = self.samples_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r, default=float) + "\n" for r in records)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.samples_path)

    def append(self, record: dict) -> None:
        self.append_all([record])

    def append_all(self, records: list[dict]) -> None:
        """Records in one write: a batched group's records land together or not at all (a kill cannot fall
        between them, which would leave a group's totals counting prompts measured again on resume)."""
        with open(self.samples_path, "a") as f:
            f.write("".join(json.dumps(record, default=float) + "\n" for record in records))
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
