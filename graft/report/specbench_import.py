"""Spec-Bench / EAGLE answer files read back as one run folder that `tables` and `plot` read
(`python -m graft.report import --format spec-bench ANSWER_DIR --out RUN_DIR`), from this harness's export or
from Spec-Bench's and EAGLE's own scripts.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

IMPORTED = " (imported)"  # ends every imported method's name, so tables and figures show which rows were imported
BASELINE_NAMES = ("vanilla", "baseline", "base", "ar")  # a file whose method part is one of these is the baseline
TEMPERATURE = re.compile(r"-temp(?:erature)?-(\d+(?:\.\d+)?)")
DTYPES = re.compile(r"-(?:float16|bfloat16|float32|fp16|bf16|fp32)(?=-|$)")


@dataclass
class AnswerFiles:
    """The answer files of one import, read, and the method each stands for."""

    folder: Path
    files: list[Path]
    read: list[dict]  # each file's {question_id: answer} (read_answer_file)
    labels: list[str]  # each file's method, as the run names it
    base: int  # the baseline file's index


def import_specbench(
    answers: Path,
    out: Path,
    baseline: str | None = None,
    model: str | None = None,
    dataset: str | None = None,
    temperature: float | None = None,
) -> tuple[Path, list[str]]:
    """Write the run folder `out` (samples.jsonl, summary.json, run.json, summaries/) of the answer files in
    `answers`: one comparison, the baseline file's answers as its baseline (`ar`) and every other file a method
    named `<its method part> (imported)`, one record per question that every file answered. Returns `out` and
    one-line notes. Numbers are the files' own: new_tokens (not speed.py's recount of the baseline's texts),
    wall_time, steps and accepted lengths; tokens/s, tau and speedup are computed from them as for this harness's
    runs, so a run exported with `export --format spec-bench` comes back with the same values."""
    answers, out = Path(answers), Path(out)
    files = _answer_files(answers, out)
    found_model, methods = _names([p.stem for p in files])
    base = _baseline_index(answers, files, methods=methods, baseline=baseline)
    model = model or found_model or "imported"
    dataset = dataset or (answers.parent.name if answers.name == "model_answer" else answers.name)
    temperature, notes = _temperature(answers, files, temperature)
    read = [read_answer_file(p) for p in files]
    labels, named = _labels(answers, files, methods=methods, found_model=found_model)
    notes += named
    found = AnswerFiles(answers, files, read, labels, base)
    partial = sorted(p.name for p, answered in zip(files, read) if any(a.get("partial") for a in answered.values()))
    if partial:
        notes.append(f"{', '.join(partial)}: exported from an unfinished run (partial); imported as partial")
    common, dropped = _common_questions(found)
    if dropped:
        notes.append(f"{dropped} questions not answered in every file were left out")
    records, steps_from = _records(found, common, dataset)
    written = _write_run(
        out,
        records,
        found,
        steps_from=steps_from,
        model=model,
        dataset=dataset,
        temperature=temperature,
        partial=bool(partial),
    )
    return written, notes


def _answer_files(answers: Path, out: Path) -> list[Path]:
    """The answer files in `answers` (two at least: the baseline's and a method's), `out` checked to be new."""
    from graft.records.reader import RecordError

    if not answers.is_dir():
        raise RecordError(f"{answers}: not a folder of answer files (<model>-<method>.jsonl)")
    files = sorted(p for p in answers.glob("*.jsonl") if p.is_file())
    if len(files) < 2:
        raise RecordError(f"{answers}: needs a baseline answer file and at least one method's; found {len(files)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RecordError(f"{out}: exists and is not an empty folder; import into a new one")
    return files


def _baseline_index(answers: Path, files: list[Path], *, methods: list[str], baseline: str | None) -> int:
    """Which of `files` is the baseline: the one named `baseline`, else the one whose method part is a
    BASELINE_NAMES name; anything but exactly one is refused."""
    from graft.records.reader import RecordError

    if baseline is not None:
        chosen = [i for i, p in enumerate(files) if p.name == Path(baseline).name]
    else:
        chosen = [i for i, m in enumerate(methods) if any(m == b or m.startswith(f"{b}-") for b in BASELINE_NAMES)]
    if len(chosen) != 1:
        raise RecordError(
            f"{answers}: which file is the baseline? {len(chosen)} of {', '.join(p.name for p in files)} look like"
            f" one ({'/'.join(BASELINE_NAMES)}); pass --baseline FILE"
        )
    return chosen[0]


def _temperature(answers: Path, files: list[Path], given: float | None) -> tuple[float, list[str]]:
    """The temperature the files were run at (`given`, else the one their names give, else 0), and a note where
    it was assumed; files named with several are refused."""
    from graft.records.reader import RecordError

    if given is not None:
        return given, []
    temperatures = {float(m.group(1)) for p in files for m in TEMPERATURE.finditer(p.stem)}
    if len(temperatures) > 1:
        raise RecordError(f"{answers}: its files were run at temperatures {sorted(temperatures)}; import one")
    if not temperatures:
        return 0.0, ["the file names give no temperature: recorded as 0 (--temperature to set it)"]
    return temperatures.pop(), []


def _labels(answers: Path, files: list[Path], *, methods: list[str], found_model: str) -> tuple[list[str], list[str]]:
    """Each file's method as the run names it, `<method>{IMPORTED}`, and a note where files sharing a method part
    (m-graft.jsonl beside m-graft-float16.jsonl) are labelled by their whole names instead."""
    from graft.records.reader import RecordError

    shared = {m for m in methods if methods.count(m) > 1}
    own = [p.stem.removeprefix(f"{found_model}-") if found_model else p.stem for p in files]
    labels = [f"{own[i] if m in shared else m}{IMPORTED}" for i, m in enumerate(methods)]
    if len(set(labels)) < len(labels):
        raise RecordError(
            f"{answers}: two answer files would be one method; rename one ({', '.join(p.name for p in files)})"
        )
    if not shared:
        return labels, []
    named = sorted(label for label, m in zip(labels, methods) if m in shared)
    return labels, [f"files sharing a method are labelled by their names: {', '.join(named)}"]


def _common_questions(found: AnswerFiles) -> tuple[list, int]:
    """The questions every file answered, in the baseline file's order, and how many others were left out."""
    from graft.records.reader import RecordError

    common = [qid for qid in found.read[found.base] if all(qid in answered for answered in found.read)]
    if not common:
        raise RecordError(f"{found.folder}: no question is answered in every file")
    return common, len(set().union(*map(set, found.read))) - len(common)


def _records(found: AnswerFiles, common: list, dataset: str) -> tuple[list[dict], dict[str, str]]:
    """One comparison record per question in `common`, the baseline file's answer as its baseline and every other
    file's as a method; and where each side's steps came from (imported_turns)."""
    from graft.records.reader import RecordError
    from graft.report.foreign import side_of

    steps_from: dict[str, str] = {}
    records = []
    for index, qid in enumerate(common):
        base_answer = found.read[found.base][qid]
        where = lambda i, qid=qid: f"{found.files[i]}:{found.read[i][qid]['_line']}"  # noqa: E731
        base_turns, steps_from["ar"] = imported_turns(base_answer, where(found.base))
        baseline_side = side_of(base_turns)
        b_tps = baseline_side["totals"]["tokens_per_s"]
        entries = {}
        for i, label in enumerate(found.labels):
            if i == found.base:
                continue
            turns, steps_from[label] = imported_turns(found.read[i][qid], where(i))
            if len(turns) != len(base_turns):
                raise RecordError(f"{where(i)}: {len(turns)} turns, the baseline's answer {len(base_turns)}")
            side = side_of(turns)
            entries[label] = {
                "side": side,
                "lossless": {"checked": False, "equal": None, "first_divergence": None},
                "speedup_wall": side["totals"]["tokens_per_s"] / b_tps if b_tps else None,
            }
        records.append(
            {
                "id": f"{dataset}-{qid}",
                "question_id": qid,
                "category": base_answer.get("category") or dataset,
                "index": index,
                "turns": len(base_turns),
                "status": "ok",
                "baseline": baseline_side,
                "methods": entries,
            }
        )
    return records, steps_from


def _write_run(
    out: Path,
    records: list[dict],
    found: AnswerFiles,
    *,
    steps_from: dict[str, str],
    model: str,
    dataset: str,
    temperature: float,
    partial: bool,
) -> Path:
    """The run folder `out` of the imported records, its summary.json and run.json carrying `imported`: the
    format, the folder, each file's sha256 and role, and where the steps came from."""
    from graft.report.foreign import write_foreign_run
    from graft.run.provenance import code

    sources = [
        {
            "file": p.name,
            "sha256": _sha256(p),
            "role": "baseline" if i == found.base else "method",
            "method": "ar" if i == found.base else found.labels[i],
            "answers": len(found.read[i]),
        }
        for i, p in enumerate(found.files)
    ]
    imported = {
        "format": "spec-bench",
        "source": str(found.folder.resolve()),
        "files": sources,
        "how": steps_from,
        "counts": "new_tokens and wall_time as the files record them (choices[0]); speed.py instead recounts the"
        " baseline's tokens from its texts",
    }
    meta = {
        "model": model,
        "dataset": dataset,
        "temperature": temperature,
        "hardware": {"device": None, "cpu": "unrecorded (imported)"},
        "imported": imported,
        "baseline_label": "ar" + IMPORTED,
    }
    config = {"imported": imported, "model": {"name": model}, "dataset": {"name": dataset}}
    config["run"] = {"temperature": temperature}
    run = {"imported": imported, "provenance": {"code": code(), "imported_files": sources}}
    return write_foreign_run(out, records, meta=meta, config=config, run=run, suffix=IMPORTED, partial=partial)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_answer_file(path: Path) -> dict:
    """{question_id: answer} of one answer file, the last answer of a question kept (as Spec-Bench's and EAGLE's
    reorg_answer_file keep it), in the order questions first appear."""
    from graft.data.sources import read_utf8
    from graft.records.reader import RecordError

    answers: dict = {}
    text = read_utf8(path, error=RecordError, expected="answer files are UTF-8 JSONL")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise RecordError(f"{path}:{number}: not valid JSON") from None
        if not isinstance(answer, dict) or "question_id" not in answer:
            raise RecordError(f"{path}:{number}: not an answer (a JSON object with question_id and choices)")
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise RecordError(f"{path}:{number}: has no choices")
        qid = answer["question_id"]
        if isinstance(qid, bool) or not isinstance(qid, (int, str)):
            raise RecordError(
                f"{path}:{number}: question_id {qid!r} is a {type(qid).__name__}; expected an integer or a string"
            )
        answers[qid] = {**answer, "_line": number}
    if not answers:
        raise RecordError(f"{path}: holds no answers")
    return answers


def imported_turns(answer: dict, where: str) -> tuple[list[dict], str]:
    """The turns of one answer's first choice as this harness's turn records, and where its steps came from.

    Steps: `decoding_steps` (Spec-Bench) where given, else `idxs` + 1 (EAGLE's loop index of a turn's last step,
    `for idx in range(max_steps)`), or `idxs` itself where `accept_lengths` holds exactly that many steps.
    Step tokens: the turn's share of `accept_lengths` (Spec-Bench's one flat list of every step's committed tokens,
    split by the steps), else `new_tokens` (EAGLE's new_token counts what its steps committed)."""
    from graft.records.reader import RecordError

    picked = answer["choices"][0]
    try:
        new_tokens = [int(n) for n in picked["new_tokens"]]
        wall = [float(s) for s in picked["wall_time"]]
        texts = picked.get("turns") or [None] * len(new_tokens)
        lengths = picked.get("accept_lengths")
        lengths = None if lengths is None else [int(n) for n in lengths]
        if picked.get("decoding_steps") is not None:
            steps, source = [int(n) for n in picked["decoding_steps"]], "decoding_steps"
        elif picked.get("idxs") is not None:
            idxs = [int(n) for n in picked["idxs"]]
            if lengths is not None and len(lengths) == sum(idxs) != sum(i + 1 for i in idxs):
                steps, source = idxs, "idxs"
            else:
                steps, source = [i + 1 for i in idxs], "idxs + 1"
        else:
            raise RecordError(f"{where}: has neither decoding_steps nor idxs; the steps of its turns are unknown")
    except KeyError as err:
        raise RecordError(f"{where}: lacks {err.args[0]}") from None
    except (TypeError, ValueError) as err:
        raise RecordError(f"{where}: a turn's new_tokens, wall_time or steps is malformed ({err})") from None
    if not (len(new_tokens) == len(wall) == len(steps) == len(texts)) or not new_tokens:
        raise RecordError(f"{where}: new_tokens, wall_time, its steps and turns differ in length")
    if lengths is not None and len(lengths) != sum(steps):
        raise RecordError(f"{where}: accept_lengths holds {len(lengths)} steps, its {source} say {sum(steps)}")
    _check_values(where, new_tokens=new_tokens, wall=wall, steps=steps, lengths=lengths)
    turns, start = [], 0
    for n, w, k, text in zip(new_tokens, wall, steps, texts):
        own = lengths[start : start + k] if lengths is not None else None
        start += k
        step_tokens = sum(own) if own is not None else n
        turns.append(
            {
                "prompt_tokens": None,
                "new_tokens": n,
                "step_tokens": step_tokens,
                "steps": k,
                "tau": step_tokens / k if k else None,
                "prefill_s": None,
                "decode_s": None,
                "wall_s": w,
                "accept_lengths": own,
                "text": text if isinstance(text, str) else None,
            }
        )
    return turns, f"steps from {source}, step tokens from {'accept_lengths' if lengths is not None else 'new_tokens'}"


def _check_values(where: str, *, new_tokens: list[int], wall: list[float], steps: list[int], lengths) -> None:
    """What an answer's numbers must be to mean anything: counts >= 0, seconds finite and > 0, a step commits at
    least one token, and a turn's steps commit its new tokens (the first may come from the prefill, and the last
    step may run past the limit and be cut)."""
    from graft.records.reader import RecordError

    for turn, (n, w, k) in enumerate(zip(new_tokens, wall, steps)):
        if n < 0 or k < 0:
            raise RecordError(f"{where}: turn {turn}: new_tokens {n}, steps {k}; expected counts >= 0")
        if not math.isfinite(w) or w <= 0:
            raise RecordError(f"{where}: turn {turn}: wall_time {w}; expected a finite number of seconds > 0")
    if lengths is None:
        return
    if any(n < 1 for n in lengths):
        raise RecordError(f"{where}: accept_lengths holds {min(lengths)}; a step commits at least 1 token")
    start = 0
    for turn, (n, k) in enumerate(zip(new_tokens, steps)):
        own = lengths[start : start + k]
        start += k
        if own and not n - 1 <= sum(own) <= n + max(own):
            raise RecordError(
                f"{where}: turn {turn}: accept_lengths commit {sum(own)} tokens, new_tokens says {n}; they must agree"
            )


def _names(stems: list[str]) -> tuple[str, list[str]]:
    """(the model, each file's method) of answer files named `<model>-<method>[-<dtype>][-temp(erature)-<t>]`: the
    longest prefix, cut after a '-', that every name shares."""
    plain = [DTYPES.sub("", TEMPERATURE.sub("", stem)) for stem in stems]
    prefix = plain[0]
    for name in plain[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    prefix = prefix[: prefix.rfind("-") + 1] if "-" in prefix else ""
    if len(plain) > 1 and all(len(name) > len(prefix) for name in plain):
        return prefix.rstrip("-"), [name[len(prefix) :] for name in plain]
    return "", plain
