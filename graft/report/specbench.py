"""Run directories as Spec-Bench answer files, so Spec-Bench's own scripts read this harness's runs:

    python -m graft.report export --format spec-bench multirun/spec_bench data/spec_bench/model_answer
    python evaluation/speed.py --file-path <target>/<model>-graft.jsonl --base-path <target>/<model>-vanilla.jsonl ...
    python evaluation/equal.py --file-path <target>/ --jsonfile1 <model>-vanilla.jsonl --jsonfile2 <model>-graft.jsonl

One JSONL file per method, `<target>/<model>-<method>.jsonl`, and the autoregressive baseline as
`<model>-vanilla.jsonl` (several runs under the source: each run's files in its own subfolder, as `export` lays
them out). One line per prompt, in the layout Spec-Bench's evaluation/eval.py (`get_model_answers`) writes:

    {"question_id": 81, "category": "writing", "answer_id": "...", "model_id": "<model>-<method>",
     "choices": [{"index": 0, "turns": [text, ...], "decoding_steps": [steps, ...], "new_tokens": [n, ...],
                  "wall_time": [seconds, ...], "accept_lengths": [tokens of each verification step, all turns]}],
     "tstamp": 1700000000.0}

`turns`, `decoding_steps`, `new_tokens` and `wall_time` hold one entry per turn; `accept_lengths` is one flat list
over the turns, as Spec-Bench extends it turn by turn (evaluation/speed.py sums the first three per question and
averages the last over all steps). The values are the record's: a turn's `new_tokens`, `wall_s` (prefill and
decode, as Spec-Bench times the whole generate call), `steps` and `accept_lengths`. `question_id` is the
dataset's own id: a record's `question_id` where it has one, else what follows `<dataset>-` in its `id`
(an integer where it is one), else the number that ends the id, else the id itself; where those are not
unique in a run (the built-in set's chat-1, code-1, ...), every record's `id` as it is.

Runs exported without their texts (`python -m graft.report export`) give empty strings as turns: Spec-Bench's
equal.py then compares nothing, and speed.py, which counts the baseline's tokens by tokenizing its texts, sees 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

BASELINE = "vanilla"  # Spec-Bench's name for plain autoregressive decoding (evaluation/inference_baseline.py)
TURN_KEYS = ("new_tokens", "wall_s", "steps", "accept_lengths")


def question_id(record: dict, dataset: str):
    """The dataset's own id of a record's prompt (see the module docstring)."""
    if record.get("question_id") is not None:
        return record["question_id"]
    rid = str(record.get("id"))
    own = rid[len(dataset) + 1 :] if dataset and rid.startswith(f"{dataset}-") else None
    if own:
        return int(own) if re.fullmatch(r"-?\d+", own) else own
    number = re.search(r"(\d+)$", rid)
    return int(number.group(1)) if number else rid


def sides(record: dict, summary: dict) -> dict[str, dict]:
    """{Spec-Bench method name: side} of one finished record, the baseline as `vanilla`."""
    found = {BASELINE: record["baseline"]} if record.get("baseline") else {}
    if "methods" in record:
        found.update({name: entry.get("side") for name, entry in record["methods"].items()})
    elif record.get("method"):
        found[str(summary.get("method", "method"))] = record["method"]
    return found


def choice(side: dict, where: str) -> tuple[dict, bool]:
    """Spec-Bench's `choices[0]` of one side, and whether every turn had its text."""
    from graft.analysis import RecordError

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


def run_answers(run: Path) -> tuple[dict[str, list[dict]], bool, int]:
    """{file name: answer lines} of one run directory, whether all its texts are there, and how many of its
    prompts were skipped (they have no answers)."""
    from graft.analysis import RecordError, read_records, read_summary

    summary, records = read_summary(run), read_records(run)
    model, dataset = str(summary["model"]), str(summary["dataset"])
    samples = run / "samples.jsonl"
    tstamp = (samples if samples.is_file() else run / "samples.jsonl.gz").stat().st_mtime
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise RecordError(f"{run}/samples.jsonl:{number}: not a JSON object")
    finished = [(number, r) for number, r in enumerate(records, 1) if r.get("status") == "ok"]
    ids = [question_id(record, dataset) for _, record in finished]
    if len(set(map(repr, ids))) < len(ids):  # e.g. the built-in set's chat-1, code-1: its ids are the strings
        ids = [str(record.get("id")) for _, record in finished]
    if len(set(ids)) < len(ids):
        raise RecordError(f"{run}: two records have the same id; Spec-Bench tells answers apart by it")
    files: dict[str, list[dict]] = {}
    texted = True
    for (number, record), qid in zip(finished, ids):
        for method, side in sides(record, summary).items():
            model_id = f"{model}-{method}"
            picked, has_text = choice(side, f"{run}/samples.jsonl:{number} ({method})")
            texted = texted and has_text
            files.setdefault(f"{model_id}.jsonl", []).append(
                {
                    "question_id": qid,
                    "category": record.get("category") or dataset,
                    "answer_id": hashlib.sha1(f"{model_id}/{record.get('id')}/{tstamp}".encode()).hexdigest()[:22],
                    "model_id": model_id,
                    "choices": [picked],
                    "tstamp": tstamp,
                }
            )
    return files, texted, len(records) - len(finished)


def export_specbench(source: Path, target: Path) -> tuple[list[Path], list[str]]:
    """Write the answer files of every finished run under `source` into `target` (other files there are left
    alone, each answer file replaced whole); returns the files written and one-line notes."""
    from graft.analysis import RecordError, run_dirs

    from graft.analysis import check_export_paths

    source, target = check_export_paths(source, target)
    if target.exists() and not target.is_dir():
        raise RecordError(f"{target}: is a file, expected a folder for the answer files")
    checked = []  # everything read and checked before anything is written
    for run in run_dirs([source]):
        files, texted, skipped = run_answers(run)
        checked.append((run, files, texted, skipped))
    written, untexted, skipped_total = [], 0, 0
    for run, files, texted, skipped in checked:
        out = target / run.relative_to(source) if run != source else target
        out.mkdir(parents=True, exist_ok=True)
        for name, lines in files.items():
            path = out / name
            partial = path.with_name(f".{name}.partial")
            partial.write_text("".join(json.dumps(line) + "\n" for line in lines))
            os.replace(partial, path)
            written.append(path)
        untexted += not texted
        skipped_total += skipped
    notes = []
    if untexted:
        notes.append(
            f"{untexted} of {len(checked)} runs hold no texts (exported without them): their turns are empty"
            " strings, so Spec-Bench's equal.py cannot compare them and speed.py counts 0 baseline tokens"
        )
    if skipped_total:
        notes.append(f"no answers for {skipped_total} prompts the runs skipped (too long for the model)")
    return written, notes
