"""`python -m graft.report <command> [arguments]`: the run tools (`<command> --help` for each one's arguments).

python -m graft.report tables multirun/cpu_embedded --out results/cpu_embedded    # Markdown + LaTeX + rows.csv
python -m graft.report plot multirun/pareto --out results/figures                 # PNG + PDF
python -m graft.report export multirun/cpu_embedded results/cpu_embedded/runs     # records to commit
python -m graft.report export --format spec-bench multirun/spec_bench answers   # Spec-Bench answer files
python -m graft.report import --format spec-bench answers --out runs/imported     # and back, or other systems'
python -m graft.report render [--check] [results/README.md]                       # generated tables
python -m graft.report compare BEFORE AFTER [--out FILE.md]                       # outputs kept?
python -m graft.report check-lossless --methods pld,graft --datasets builtin      # one baseline, many methods
python -m graft.report summarize outputs/**/summary.json [--out table.md]         # one Markdown table
"""

from __future__ import annotations

import importlib

from graft.run.commands import one_line_errors, pick

COMMANDS = {  # command -> (module, what it does)
    "tables": ("graft.report.tables", "paper-shaped tables of run or sweep directories"),
    "plot": ("graft.report.figures", "figures of run or sweep directories"),
    "export": ("graft.report.export", "finished run directories without their texts, to commit"),
    "import": ("graft.report.importer", "Spec-Bench / EAGLE answer files as a run folder the tables and figures read"),
    "render": ("graft.report.render", "rewrite (or --check) the generated tables of results/README.md"),
    "compare": ("graft.report.compare", "two sets of run directories, method by method"),
    "check-lossless": ("graft.report.lossless", "many methods against one greedy baseline per prompt"),
    "summarize": ("graft.report.summarize", "the summary.json of several runs as one Markdown table"),
}


@one_line_errors  # bad input (a record, a file, a config value) is one line and exit 2, as in run.py
def main(argv: list[str] | None = None) -> None:
    command, rest = pick(__doc__, COMMANDS, argv)
    module = importlib.import_module(COMMANDS[command][0])
    if hasattr(module, "before_torch"):
        module.before_torch()
    module.main(rest)


if __name__ == "__main__":
    main()
