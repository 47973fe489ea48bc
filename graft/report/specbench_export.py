"""Run directories as Spec-Bench answer files (`python -m graft.report export --format spec-bench`), one JSONL file
per method, so Spec-Bench's own scripts read this harness's runs:

    python -m graft.report export --format spec-bench multirun/spec_bench data/spec_bench/model_answer
    python evaluation/speed.py --file-path <target>/<model>-graft.jsonl --base-path <target>/<model>-vanilla.jsonl ...
    python evaluation/equal.py --file-path <target>/ --jsonfile1 <model>-vanilla.jsonl --jsonfile2 <model>-graft.jsonl
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from graft.report.specbench import BASELINE, MT_BENCH_CATEGORIES, TASKS, question_id, spec_bench_category

TURN_KEYS = ("new_tokens", "wall_s", "steps", "accept_lengths")


def sides(record: dict, summary: dict) -> dict[str, dict]:
    """{Spec-Bench method name: side} of one finished record, the baseline as `vanilla`."""
    found = {BASELINE: record["baseline"]} if record.get("baseline") else {}
    if "methods" in record:
        found.update({name: entry.get("side") for name, entry in record["methods"].items()})
    elif record.get("method"):
        found[str(summary.get("method", "method"))] = record["method"]
    return found


def choice(side: dict, where: str) -> tuple[dict, bool]:
    """Spec-Bench's `choices[0]` of one side, and whether every turn had its text. The values are the record's: a
    turn's `new_tokens`, `wall_s` (prefill and decode, as Spec-Bench times the whole generate call), `steps` and
    `accept_lengths`."""
    from graft.records.reader import RecordError

    turns = side.get("turns") if isinstance(side, dict) else None
    if not isinstance(turns, list) or not turns:
        raise RecordError(f"{where}: has no turns")
    for number, turn in enumerate(turns, 1):
        missing = [key for key in TURN_KEYS if not isinstance(turn, dict) or key not in turn]
        if missing:
            raise RecordError(f"{where}: turn {number} lacks {', '.join(missing)}; is it a record of this harness?")
    texted = all(isinstance(turn.get("text"), str) for turn in turns)
    try:
        picked = {
            "index": 0,
            "turns": [turn.get("text") or "" for turn in turns],
            "decoding_steps": [int(turn["steps"]) for turn in turns],
            "new_tokens": [int(turn["new_tokens"]) for turn in turns],
            "wall_time": [float(turn["wall_s"]) for turn in turns],
            "accept_lengths": [int(n) for turn in turns for n in turn["accept_lengths"]],
        }
    except (TypeError, ValueError) as err:
        raise RecordError(
            f"{where}: a turn's steps, new_tokens, wall_s or accept_lengths is malformed ({err})"
        ) from None
    return picked, texted


def run_answers(run: Path) -> tuple[dict[str, list[dict]], bool, int, dict[str, int]]:
    """{file name: answer lines} of one run directory, whether all its texts are there, how many of its prompts
    were skipped (they have no answers), and {category: prompts} of those with no Spec-Bench task.

    A category CATEGORIES does not name is refused, naming it. So is a run without its texts (as `python -m
    graft.report export` commits them): speed.py counts the baseline's tokens by tokenizing its texts, so empty
    turns give it a negative baseline speed (one token less than nothing per turn) and a meaningless speedup.
    Even with the texts, speed.py's count of the baseline's tokens is not ours: it tokenizes each answer again and
    takes one token off for a BOS the tokenizer is assumed to add (docs/experiments.md gives the size of the
    difference); the methods' `new_tokens` it reads as written."""
    from graft.records.reader import RecordError, read_records, read_summary

    summary, records = read_summary(run), read_records(run)
    model, dataset = str(summary["model"]), str(summary["dataset"])
    samples = run / "samples.jsonl"
    tstamp = (samples if samples.is_file() else run / "samples.jsonl.gz").stat().st_mtime
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise RecordError(f"{run}/samples.jsonl:{number}: not a JSON object")
    # the first pass of a run.repeats run: one answer per question, as Spec-Bench's files hold
    finished = [(n, r) for n, r in enumerate(records, 1) if r.get("status") == "ok" and r.get("repeat", 1) == 1]
    ids = [question_id(record, dataset) for _, record in finished]
    if len(set(map(repr, ids))) < len(ids):  # e.g. the built-in set's chat-1, code-1: its ids are the strings
        ids = [str(record.get("id")) for _, record in finished]
    if len(set(ids)) < len(ids):
        raise RecordError(f"{run}: two records have the same id; Spec-Bench tells answers apart by it")
    categories = {}
    for _, record in finished:
        ours = str(record.get("category") or dataset)
        categories.setdefault(ours, spec_bench_category(dataset, ours))
    unknown = sorted(c for c, theirs in categories.items() if theirs is None)
    if unknown:
        raise RecordError(
            f"{run}: dataset {dataset}'s categories {', '.join(unknown)} have no Spec-Bench category; name one (or"
            " None: no task) for each in graft/report/specbench.py CATEGORIES"
        )
    taskless: dict[str, int] = {}
    files: dict[str, list[dict]] = {}
    texted = True
    for (number, record), qid in zip(finished, ids):
        category = categories[str(record.get("category") or dataset)]
        if category not in TASKS and category not in MT_BENCH_CATEGORIES:
            taskless[category] = taskless.get(category, 0) + 1
        for method, side in sides(record, summary).items():
            model_id = f"{model}-{method}"
            picked, has_text = choice(side, f"{run}/samples.jsonl:{number} ({method})")
            texted = texted and has_text
            files.setdefault(f"{model_id}.jsonl", []).append(
                {
                    "question_id": qid,
                    "category": category,
                    "answer_id": hashlib.sha1(f"{model_id}/{record.get('id')}/{tstamp}".encode()).hexdigest()[:22],
                    "model_id": model_id,
                    "choices": [picked],
                    "tstamp": tstamp,
                }
            )
    if not texted:
        raise RecordError(
            f"{run}: its records hold no texts (exported without them?); Spec-Bench's speed.py counts the baseline's"
            " tokens from its texts, so export from the folder the run wrote"
        )
    return files, texted, len(records) - len(finished), taskless


def export_specbench(
    source: Path, target: Path, partial: bool = False, replace: bool = False
) -> tuple[list[Path], list[str]]:
    """Write the answer files of every finished run under `source` (with `partial`, unfinished ones too) into
    `target` (other files there are left alone; an answer file already there is refused unless `replace`, then
    replaced whole); returns the files written and one-line notes. One file per method,
    `<target>/<model>-<method>.jsonl`, the autoregressive baseline as `<model>-vanilla.jsonl`; several runs under
    `source` each write theirs in their own subfolder, as `export` lays them out."""
    from graft.records.reader import RecordError, check_export_paths, run_dirs

    source, target = check_export_paths(source, target)
    if target.exists() and not target.is_dir():
        raise RecordError(f"{target}: is a file, expected a folder for the answer files")
    checked = []  # everything read and checked before anything is written
    taskless: dict[str, int] = {}
    unfinished: dict = {}
    for run in run_dirs([source], partial, unfinished):
        files, texted, skipped, outside = run_answers(run)
        if unfinished.get(run):  # a mark Spec-Bench's scripts ignore and `import` honours: not a finished result
            files = {name: [{**line, "partial": True} for line in lines] for name, lines in files.items()}
        checked.append((run, files, texted, skipped))
        for category, count in outside.items():
            taskless[category] = taskless.get(category, 0) + count
    there = [target / run.relative_to(source) / name for run, files, _, _ in checked for name in files]
    there = [path for path in there if path.exists()]
    if there and not replace:
        more = f" (and {len(there) - 1} more)" if len(there) > 1 else ""
        raise RecordError(f"{there[0]}: already there{more}; pass --replace to replace the answer files it writes")
    written, skipped_total = [], 0
    for run, files, _, skipped in checked:
        out = target / run.relative_to(source) if run != source else target
        out.mkdir(parents=True, exist_ok=True)
        for name, lines in files.items():
            path = out / name
            partial = path.with_name(f".{name}.partial")
            partial.write_text("".join(json.dumps(line) + "\n" for line in lines))
            os.replace(partial, path)
            written.append(path)
        skipped_total += skipped
    notes = []
    if taskless:
        listed = ", ".join(f"{category} ({count})" for category, count in sorted(taskless.items()))
        notes.append(f"no Spec-Bench task for {listed}: written as they are, counted only in speed.py's overall")
    if skipped_total:
        notes.append(f"no answers for {skipped_total} prompts the runs skipped (too long for the model)")
    return written, notes
