"""A non-editable install runs on its own: `pip install --no-deps` of this repository into a fresh virtual
environment, then the `graft-run` console script from another directory, with the configs (graft/configs) found
inside the installed package, not in the checkout.

Offline and quick: the fresh environment borrows this one's dependencies through a .pth file naming its
site-packages (their own .pth files, this checkout's editable install among them, are not processed there), so
nothing is downloaded, and pip and setuptools come from it too (--no-build-isolation); --ignore-installed keeps
pip off the editable install it sees there."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # builds and installs the wheel (about 30 s): `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
RUN = ["model=tiny_llama", "method=ar", "run.num_prompts=1", "run.max_new_tokens=4", "logger=none", "hardware=cpu"]


def missing_tools() -> str | None:
    for module in ("venv", "pip", "setuptools"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not available to {sys.executable}"
    return None


def clean_env() -> dict:
    """This environment without what would let the checkout leak in (PYTHONPATH, a virtualenv's PATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def run(cmd: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        list(map(str, cmd)), cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A fresh virtual environment with this repository installed into it (not editable)."""
    reason = missing_tools()
    if reason:
        pytest.skip(f"cannot build a fresh install: {reason}")
    base = tmp_path_factory.mktemp("install")
    env_dir = base / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env_dir)], capture_output=True, text=True, timeout=120
    )
    if made.returncode != 0:
        pytest.skip(f"python -m venv failed here: {(made.stderr.strip().splitlines() or ['no message'])[-1]}")
    python = env_dir / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base).stdout.strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "borrowed.pth").write_text("".join(f"{path}\n" for path in borrowed))
    # built from a copy of what the package is made of: pip's build leaves build/ and *.egg-info where it
    # builds, and the checkout may hold compiled leftovers
    source = base / "source"
    leftovers = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build")
    for folder in ("graft", "baselines"):
        shutil.copytree(ROOT / folder, source / folder, ignore=leftovers)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--ignore-installed",
            "-q",
            source,
        ],
        base,
    )
    return env_dir


def test_a_non_editable_install_runs_graft_run_from_anywhere(fresh, tmp_path):
    python = fresh / "bin" / "python"
    where = run(
        [python, "-c", "import graft, graft.config.hydra_setup as c; print(graft.__file__); print(c.CONFIG_DIR)"],
        tmp_path,
    )
    package, configs = map(Path, where.stdout.split())
    assert package.is_relative_to(fresh), f"graft imported from {package}, not from the fresh install"
    assert configs.is_relative_to(fresh) and (configs / "config.yaml").is_file()
    assert (configs.parent / "heads" / "smollm2_135m_eagle3" / "config.json").is_file()  # shipped heads too

    out = tmp_path / "out"
    proc = run([fresh / "bin" / "graft-run", *RUN, f"run.out_dir={out}", "run.progress=false"], tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "tiny_llama" and summary["n_prompts"] == 1
    assert "records:" in proc.stdout
    # Hydra composed the installed package's configs, not the checkout's
    sources = yaml.safe_load((out / ".hydra" / "hydra.yaml").read_text())["hydra"]["runtime"]["config_sources"]
    main = next(s["path"] for s in sources if s["provider"] == "main")
    assert Path(main.removeprefix("file://")).is_relative_to(fresh), main
    assert not (tmp_path / "outputs").exists()  # everything went to run.out_dir

    # the report tools too: plot draws the paper's figures (package data) beside the run
    run([fresh / "bin" / "graft-report", "plot", str(out), "--out", str(tmp_path / "figures")], tmp_path)
    assert (tmp_path / "figures" / "beside_paper.png").stat().st_size > 1000
