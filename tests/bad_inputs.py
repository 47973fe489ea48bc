"""Run many command lines in one Python process: `python tests/bad_inputs.py CASES.json RESULTS.json`.

Each case is {"id", "tool": "run" | "report", "args": [...]}; the parent starts as run.py does and imports the
harness and the report tools once (the slow part of a start-up), then forks a child per case, which runs the
command as `python run.py ARGS` or `python -m graft.report ARGS` would and exits with its status. The parent never computes with torch,
so each child starts from a clean OpenMP state. RESULTS.json maps each id to {"code", "stdout", "stderr"}.
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


def _child(case: dict, out: Path, err: Path) -> None:
    for stream, path in ((1, out), (2, err)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, stream)
    signal.alarm(CASE_SECONDS)
    code = 0
    try:
        if case["tool"] == "run":
            import runpy

            sys.argv = [str(ROOT / "run.py"), *case["args"], "run.progress=false"]
            runpy.run_path(sys.argv[0], run_name="__main__")  # as a script, as a user runs it
        else:
            from graft.report.__main__ import main

            sys.argv = ["graft.report", *case["args"]]
            main(case["args"])
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


def main(cases_path: str, results_path: str) -> None:
    os.chdir(ROOT)
    from graft.cli import prepare

    prepare()  # as run.py starts: the OpenMP policy, then the configs' schemas and resolvers, before the forks
    import graft.runner  # noqa: F401  (torch, transformers, Hydra: the slow part of a start-up)
    import graft.report.__main__  # noqa: F401

    cases = json.loads(Path(cases_path).read_text())
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for case in cases:
            out, err = Path(scratch) / "out", Path(scratch) / "err"
            pid = os.fork()
            if pid == 0:
                _child(case, out, err)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            results[case["id"]] = {"code": code, "stdout": out.read_text(), "stderr": err.read_text()}
    Path(results_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
