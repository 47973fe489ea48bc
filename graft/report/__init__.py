"""Reports of finished runs, the tools of `python -m graft.report <command>` (the console table at the end of a
run is graft/analysis/console.py):

- tables (tables.py): paper-shaped tables of run or sweep directories, Markdown, LaTeX and rows.csv;
- plot (figures.py): the figures of run or sweep directories, PNG and PDF;
- export (export.py): finished run directories stripped of their texts, to commit;
- render (render.py): the generated tables of results/README.md rewritten from the committed records;
- compare (compare.py): two sets of run directories, method by method: did a change keep every output?
- check-lossless (lossless.py): many methods against one greedy baseline per prompt, in one process;
- summarize (summarize.py): the summary.json of several runs as one Markdown table.

e2e.py holds the side by side's systems and summary (graft/bench/e2e.py runs it; render reads its JSON).
"""
