"""Reports of runs: the console table at the end of a run (console.py), and the run tools of
`python -m graft.report <command>`:

- tables (tables.py): paper-shaped tables of run or sweep directories, Markdown, LaTeX and rows.csv;
- plot (figures.py): the figures of run or sweep directories, PNG and PDF;
- export (export.py): finished run directories stripped of their texts, to commit;
- render (render.py): the generated tables of results/README.md rewritten from the committed records;
- compare (compare.py): two sets of run directories, method by method: did a change keep every output?
- check-lossless (lossless.py): many methods against one greedy baseline per prompt, in one process;
- summarize (summarize.py): the summary.json of several runs as one Markdown table.

e2e.py holds the side by side's systems and summary (scripts/bench_e2e.py runs it; render reads its JSON).
"""

from graft.report.console import print_comparison, print_summary

__all__ = ["print_comparison", "print_summary"]
