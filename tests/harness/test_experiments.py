"""Every experiment composes with every hardware config, at every point of its sweep, and validates (the SLURM
launcher's sizing of each job: tests/harness/test_slurm.py)."""

import itertools
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, compose

from graft.config.experiment import validate
from graft.config.hydra_setup import CONFIG_DIR, group_options


def sweep_points(experiment: str) -> list[list[str]]:
    """The overrides of each job `python run.py -m experiment=<experiment>` launches (basic sweeper)."""
    raw = yaml.safe_load((CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()) or {}
    params = ((raw.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    for parent in raw.get("defaults", []):  # an experiment deriving from another sweeps what that one sweeps
        if isinstance(parent, str) and parent != "_self_":
            parent_params = (
                (yaml.safe_load((CONFIG_DIR / "experiment" / f"{parent}.yaml").read_text()).get("hydra") or {}).get(
                    "sweeper"
                )
                or {}
            ).get("params") or {}
            params = {**parent_params, **params}
    axes = [[f"{key}={value}" for value in _split(str(values))] for key, values in params.items()]
    return [list(point) for point in itertools.product(*axes)] or [[]]


def _split(values: str) -> list[str]:
    """Hydra's sweep list a,b,[x,y] split at top-level commas."""
    out, depth, current = [], 0, ""
    for char in values:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += char
    return [*out, current]


@pytest.mark.parametrize("experiment", group_options("experiment"))
@pytest.mark.parametrize("hardware", group_options("hardware"))
def test_every_experiment_composes_at_every_sweep_point(experiment, hardware):
    points = sweep_points(experiment)
    for point in points:
        cfg = validate(compose([f"experiment={experiment}", f"hardware={hardware}", *point]))
        assert cfg.compared  # a comparison or one method per job
        if cfg.methods is not None:
            assert cfg.method.name == "ar"


def test_paper_experiments_cover_the_papers_models_sets_and_methods():
    short = sweep_points("paper_short")
    assert len(short) == 3 * 5 * 2  # models x EAGLE-3 sets x (greedy, temperature 1)
    cfg = validate(compose(["experiment=paper_short", *short[0]]))
    assert [m.name for m in cfg.methods] == ["eagle3", "pruned", "graft"]
    graft = cfg.methods[2]
    assert (
        graft.params.total_tokens == 60
        and graft.of("source", "eagle").depth == 7
        and graft.of("source", "eagle").top_k == 10
    )
    large = validate(compose(["experiment=paper_large", *sweep_points("paper_large")[0]]))
    assert large.model.name == "qwen3_235b" and large.model.num_gpus == "auto"  # the memory plan's: 4 H200s
    long = validate(compose(["experiment=paper_long", *sweep_points("paper_long")[0]]))
    assert max(long.dataset.lengths) == 65536
    pareto = sweep_points("pareto")
    assert len(pareto) == 6 * 3
    cfg = validate(compose(["experiment=pareto", *pareto[-1]]))
    assert [m.params.total_tokens for m in cfg.methods] == [128] * 6
    assert cfg.methods[2].of("split", "stage").thresholds == [0.2, 0.1, 0.05]
    assert cfg.methods[5].of("split", "stage").thresholds == [0.2, 0.1, 0.05]  # dflash_tree shares them
    dflash = validate(compose(["experiment=paper_dflash", *sweep_points("paper_dflash")[0]]))
    assert dflash.model.name == "qwen3_8b" and [m.name for m in dflash.methods] == [
        "dflash",
        "dflash_graft",
        "dflash_tree",
    ]
    assert dflash.methods[0].of("source", "dflash").checkpoint == "z-lab/Qwen3-8B-DFlash-b16"
    assert len(sweep_points("paper_dflash")) == 5


@pytest.mark.parametrize("experiment", ["paper_short", "paper_long", "paper_large", "paper_dflash"])
def test_the_paper_experiments_run_batch_1_and_take_the_batch_axis(experiment):
    """Their sweeps name run.batch_size: 1 (the paper's tables), their headers say how to add the axis, and a job
    of the axis a command line adds (run.batch_size=1,8,32 replaces the sweep's 1) composes and validates."""
    points = sweep_points(experiment)
    assert all("run.batch_size=1" in point for point in points)
    header = (CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text().split("defaults:")[0]
    assert "run.batch_size" in header
    for batch in (8, 32):
        point = [o for o in points[0] if not o.startswith("run.batch_size=")]
        cfg = validate(compose([f"experiment={experiment}", *point, f"run.batch_size={batch}"]))
        assert cfg.run.batch_size == batch and cfg.hardware.name == "gpu"


def test_an_experiment_prints_its_job_config():
    proc = subprocess.run(
        [sys.executable, "run.py", "experiment=paper_short", "--cfg", "job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "methods:" in proc.stdout and "- graft" in proc.stdout
