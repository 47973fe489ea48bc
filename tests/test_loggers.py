"""Weights & Biases offline: the run directory with the summary and the per-sample table appears, the
sync command is printed, and a job that raises still finishes its W&B run."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, compose

pytest.importorskip("wandb")


def test_an_offline_run_logs_its_summary_table_and_figure(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    out = tmp_path / "run"
    args = [
        "model=tiny_llama",
        "methods=[pld,graft]",
        "run.num_prompts=2",
        "run.max_new_tokens=8",
        "logger=wandb",
        f"run.out_dir={out}",
        "run.progress=false",
    ]
    proc = subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wandb sync" in proc.stdout
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    files = runs[0] / "files"
    log = next(runs[0].glob("run-*.wandb")).read_bytes()  # offline: the summary lives in the run's record log
    assert all(key in log for key in (b"graft/tau", b"ar/tau", b"pld/speedup_wall", b"lossless"))
    assert list(files.rglob("pareto_*.png"))
    table = json.loads(next(files.rglob("samples_*.table.json")).read_text())
    assert table["columns"][:3] == ["id", "category", "method"] and len(table["data"]) == 4  # 2 prompts x 2 methods


def test_a_failing_job_still_finishes_its_wandb_run(tmp_path, monkeypatch):
    import wandb

    from graft import runner
    from graft.config import validate

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    resolved = compose(["experiment=smoke", "logger=wandb", f"run.out_dir={tmp_path}"])
    resolved["run"]["out_dir"] = str(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("a job that fails")

    monkeypatch.setattr(runner, "measure_prompt", broken)
    with pytest.raises(RuntimeError, match="a job that fails"):
        runner.run(validate(resolved), resolved)
    assert wandb.run is None  # finished, not left open
    assert list((tmp_path / "wandb").glob("offline-run-*"))
