"""Run many command lines in one Python process: `python tests/bad_inputs.py CASES.json RESULTS.json`.

Each case is {"id", "tool", "args": [...]}, tool one of TOOLS or "module:NAME" (`python -m NAME ARGS`); the parent starts as run.py does and imports the
harness and the report tools once (the slow part of a start-up), then forks a child per case (two at a time on
two cores, each with one torch thread), which runs the
command as `python run.py ARGS` or `python -m graft.<tool> ARGS` would and exits with its status. The parent
never computes with torch, so each child starts from a clean OpenMP state. RESULTS.json maps each id to
{"code", "stdout", "stderr"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASE_SECONDS = 240
# children at once: most cases wait on Python, not on torch, so one per core (each with one torch thread)
PARALLEL = max(1, min(2, os.cpu_count() or 1))
# tool -> the module whose main(argv) is `python -m <module> ARGS` (run: python run.py ARGS)
TOOLS = {
    "report": "graft.report.__main__",
    "train": "graft.train.__main__",
    "costmodel": "graft.costmodel.__main__",
    "gpu_check": "graft.gpu_check.__main__",
    "bench": "graft.bench.__main__",
    "peers": "graft.peers.__main__",
}


def _child(case: dict, out: Path, err: Path, shared: bool = True, seconds: int = CASE_SECONDS) -> None:
    for stream, path in ((1, out), (2, err)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, stream)
    signal.alarm(seconds)
    if shared and PARALLEL > 1:
        import torch

        torch.set_num_threads(1)  # the children share the cores
    code = 0
    try:
        if case["tool"] == "run":
            import runpy

            sys.argv = [str(ROOT / "run.py"), *case["args"], "run.progress=false"]
            runpy.run_path(sys.argv[0], run_name="__main__")  # as a script, as a user runs it
        elif case["tool"].startswith("module:"):  # python -m MODULE ARGS
            import runpy
            import warnings

            module = case["tool"].removeprefix("module:")
            sys.argv = [module, *case["args"]]
            # this parent imported the module already; a user's `python -m` starts fresh and sees no such warning
            warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package")
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            import importlib

            module = TOOLS[case["tool"]]
            sys.argv = [module.removesuffix(".__main__"), *case["args"]]
            status = importlib.import_module(module).main(case["args"])
            code = status if isinstance(status, int) else 0  # gpu_check returns its status
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _collect(running: dict, results: dict) -> None:
    """Wait for any one child and record its case's outcome."""
    pid, status = os.wait()
    case, out, err = running.pop(pid)
    results[case["id"]] = {
        "code": os.waitstatus_to_exitcode(status),
        "stdout": out.read_text(),
        "stderr": err.read_text(),
    }


def _start() -> None:
    os.chdir(ROOT)
    from graft.run.cli import prepare

    prepare()  # as run.py starts: the OpenMP policy, then the configs' schemas and resolvers, before the forks
    import importlib

    import graft.run.runner  # noqa: F401  (torch, transformers, Hydra: the slow part of a start-up)

    for module in [*TOOLS.values(), "graft.train.eagle3", "graft.train.dflash"]:
        importlib.import_module(module)


def serve() -> None:
    """`python tests/bad_inputs.py --serve`: one command at a time, as the suite's run_cli asks for them. Each
    stdin line is {"case", "out", "err", "seconds"}; once its child exits, one stdout line {"code"} answers.
    The child has the cores to itself, as a `python run.py` of its own would."""
    _start()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request["case"], Path(request["out"]), Path(request["err"]), False, request["seconds"])
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


def main(cases_path: str, results_path: str) -> None:
    _start()
    cases = json.loads(Path(cases_path).read_text())
    results = {}
    running: dict[int, tuple[dict, Path, Path]] = {}  # pid -> its case and output files
    with tempfile.TemporaryDirectory() as scratch:
        for number, case in enumerate(cases):
            if len(running) >= PARALLEL:
                _collect(running, results)
            out, err = Path(scratch) / f"{number}.out", Path(scratch) / f"{number}.err"
            pid = os.fork()
            if pid == 0:
                _child(case, out, err)
            running[pid] = (case, out, err)
        while running:
            _collect(running, results)
    Path(results_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main(*sys.argv[1:])
