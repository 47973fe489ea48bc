"""`python -m graft.costmodel <command> [arguments]`: measure and use cost profiles (`<command> --help` for each).

python -m graft.costmodel profile [model=smollm2_135m hardware=cpu] [--out results/cost_model/cost_profile_cpu.json]
python -m graft.costmodel project RUN_DIR... --profile results/cost_model/cost_profile_cpu.json [--budgets]
python -m graft.costmodel forward [model=smollm2_135m] [--paths none,transposed,bf16] [--out FILE.json]
"""

from __future__ import annotations

import importlib
import os
import sys

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


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join(
        [__doc__.strip(), "", "commands:", *(f"  {name:<{width}}  {what}" for name, (_, what, _) in COMMANDS.items())]
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    module, _, timed = COMMANDS[command]
    if timed:
        before_torch()
    importlib.import_module(module).main(rest)


if __name__ == "__main__":
    main()
