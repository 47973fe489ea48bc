"""Sweeps that survive their failures. Hydra's local launcher stops a sweep at the first job that raises,
so a job that fails records why in `failed.json` in its own folder and returns; when the sweep ends,
`FailedJobs` names every failed job and exits non-zero. A rerun of the sweep skips the finished jobs and
retries the failed ones (their failed.json is removed when they start again)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from hydra.experimental.callback import Callback

FAILED = "failed.json"


def clear_failure(job_dir: str | Path) -> None:
    (Path(job_dir) / FAILED).unlink(missing_ok=True)


def record_failure(job_dir: str | Path, err: BaseException) -> Path:
    path = Path(job_dir) / FAILED
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = traceback.format_exception(type(err), err, err.__traceback__)
    path.write_text(json.dumps({"error": f"{type(err).__name__}: {err}", "traceback": lines[-12:]}, indent=2))
    return path


def failed_jobs(sweep_dir: str | Path) -> list[tuple[Path, str]]:
    return [(p.parent, json.loads(p.read_text())["error"]) for p in sorted(Path(sweep_dir).rglob(FAILED))]


class FailedJobs(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        failed = failed_jobs(config.hydra.sweep.dir)
        if not failed:
            return
        print(
            f"\n{len(failed)} job(s) of the sweep failed (the others ran); rerun the same command to retry them:",
            file=sys.stderr,
        )
        for job_dir, error in failed:
            print(f"  {job_dir}: {error.splitlines()[0][:300]}", file=sys.stderr)
        sys.exit(1)
