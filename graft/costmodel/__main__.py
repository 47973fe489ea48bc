"""`python -m graft.costmodel <command> [arguments]`: measure and use cost profiles (`<command> --help` for each).

python -m graft.costmodel profile [model=smollm2_135m hardware=cpu] [--out results/cost_model/cost_profile_cpu.json]
python -m graft.costmodel project RUN_DIR... --profile results/cost_model/cost_profile_cpu.json [--budgets]
python -m graft.costmodel forward [model=smollm2_135m] [--paths none,transposed,bf16] [--out FILE.json]
"""

from __future__ import annotations

import importlib
import os

from graft.run.commands import one_line_errors, pick

COMMANDS = {  # command -> (module, what it does, whether it times forwards)
    "profile": ("graft.costmodel.profile", "measure a device's cost profile (verify, overhead, drafts)", True),
    "project": ("graft.costmodel.project", "projected speedups of recorded runs beside the measured ones", False),
    "forward": ("graft.costmodel.forward", "the target forward's cost per fast path, against its roofs", True),
}


def before_torch() -> None:
    """As run.py does before torch loads libgomp and allocates: OpenMP workers spin, huge pages asked for."""
    os.environ.setdefault("GOMP_SPINCOUNT", "100000000")
    from graft.cpu.threads import prefer_huge_pages  # imports no torch

    prefer_huge_pages()


@one_line_errors  # bad input is one line and exit 2, as in run.py (graft/run/commands.py)
def main(argv: list[str] | None = None) -> None:
    command, rest = pick(__doc__, COMMANDS, argv)
    module, _, timed = COMMANDS[command]
    if timed:
        before_torch()
        from graft.run.logs import to_console

        to_console()  # what loading a model says (graft/run/logs.py), as a run shows it
    importlib.import_module(module).main(rest)


if __name__ == "__main__":
    main()
