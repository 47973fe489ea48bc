from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")

import torch  # noqa: E402

# Random-weight tiny models drift into subnormal floats on some prompts, which makes x86 math ~25x slower
# (measured: 108 ms vs 4 ms per tiny decode step). Flushing them changes nothing the tests compare.
torch.set_flush_denormal(True)
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: each computes on its own core
    torch.set_num_threads(1)


def compose(overrides: list[str]) -> dict:
    """The resolved config dict that `python run.py <overrides>` would see."""
    from graft.config.experiment import compose as compose_config

    # the suite tests the CPU engine wherever it runs (the default hardware=auto would take a GPU where there is
    # one); tests of other hardware configs, and experiments (which name theirs), say so
    if not any(o.lstrip("+").split("=")[0] in ("hardware", "experiment") for o in overrides):
        overrides = [*overrides, "hardware=cpu"]
    return compose_config(overrides)


@functools.lru_cache(maxsize=None)
def load_tiny(name: str):
    """A tiny random model; `name:path` selects a fast path (default: transformers' own forward), `name:path:dtype`
    its cache's dtype too."""
    from graft.config.experiment import validate
    from graft.load.models import load_model

    name, _, fast_path = name.partition(":")
    fast_path, _, cache = fast_path.partition(":")
    chosen = [f"hardware.fast_path={fast_path or 'none'}", f"hardware.cache_dtype={cache or 'auto'}"]
    cfg = validate(compose([f"model={name}", "logger=none", *chosen]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)  # again: loading may reset the floating-point mode
    return model


@pytest.fixture
def tiny():
    return load_tiny


@pytest.fixture(autouse=True, scope="session")
def cost_profile_cache(tmp_path_factory):
    """Profiles measured by method.cost_profile=auto (and by run.py subprocesses) land in a folder of this
    session, never in the user's cache."""
    os.environ["GRAFT_COST_PROFILES"] = str(tmp_path_factory.mktemp("cost_profiles"))


@functools.lru_cache(maxsize=None)
def method_yaml(method: str) -> tuple:
    """configs/method/<method>.yaml as composed (its defaults chain resolved), as sorted items."""
    return tuple(sorted(compose([f"method={method}"])["method"].items(), key=lambda kv: kv[0]))


def make_drafter(method: str, target, **overrides):
    """The drafter `python run.py method=<method> method.<key>=<value> ...` builds, on `target` (a tiny
    model's `draft_head: random` stands in for a published head)."""
    from graft.registry import build_drafter, method_config

    raw = {**dict(method_yaml(method)), **overrides}
    return build_drafter(method_config(raw, draft_head="random", block_drafter="random"), target)


def finish_run(folder: Path) -> Path:
    """Mark a hand-written run folder finished as graft/run/runner.py does at its end: summary.json's `complete`
    names every record of samples.jsonl and their sha1 (the report tools read finished runs only)."""
    import json

    from graft.records.writer import records_digest

    folder = Path(folder)
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((folder / "summary.json").read_text())
    plan = {"num_prompts": None, "dataset_num_prompts": None}
    summary["complete"] = {"plan": plan, "ids": [r["id"] for r in records], "records_sha1": records_digest(records)}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA; without it they are skipped with the reason."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not keywords: those hold folder names (tests/gpu/)
            item.add_marker(skip)


class RunServer:
    """`python run.py ARGS` as a child forked from one Python that has already imported the harness
    (tests/bad_inputs.py --serve): the same script, arguments and exit status, without paying the start-up
    (4 s of imports) for every command. Started on first use, stopped when the suite ends."""

    proc: subprocess.Popen | None = None

    def __call__(self, args: list[str], timeout: int) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "bad_inputs.py"), "--serve"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            atexit.register(self.proc.stdin.close)  # the server's loop ends with its stdin
        with tempfile.TemporaryDirectory() as scratch:
            out, err = Path(scratch) / "out", Path(scratch) / "err"
            case = {"id": "run", "tool": "run", "args": list(args)}
            request = {"case": case, "out": str(out), "err": str(err), "seconds": timeout}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
            if not answer:
                raise RuntimeError(f"the run server (tests/bad_inputs.py --serve) exited with {self.proc.wait()}")
            code = json.loads(answer)["code"]
            return subprocess.CompletedProcess(["run.py", *args], code, out.read_text(), err.read_text())


run_forked = RunServer()
