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

A run without its texts (as `python -m graft.report export` commits them) is refused, naming the run: speed.py
counts the baseline's tokens by tokenizing its texts, so empty turns give it a negative baseline speed (one token
less than nothing per turn) and a meaningless speedup. Even with the texts, speed.py's count of the baseline's
tokens is not ours: it tokenizes each answer again and takes one token off for a BOS the tokenizer is assumed to
add (docs/experiments.md gives the size of the difference); the methods' `new_tokens` it reads as written.

`category` is Spec-Bench's, so that speed.py's tasks (mt_bench, translation, summarization, qa, math_reasoning,
rag) hold what they should: MT-Bench's eight categories stay as they are in an MT-Bench set (speed.py's mt_bench
task), every other category is mapped by CATEGORIES (the built-in set's and GSM8K's `math` is math_reasoning, not
MT-Bench's math); a category mapped to None has no Spec-Bench task and is written as it is (speed.py's "overall"
counts it, no task does: a note says which), and a category CATEGORIES does not name is refused, naming it.

`python -m graft.report import --format spec-bench ANSWER_DIR --out RUN_DIR` reads such files back, from this
harness or from Spec-Bench / EAGLE (`import_specbench`, below).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

BASELINE = "vanilla"  # Spec-Bench's name for plain autoregressive decoding (evaluation/inference_baseline.py)
TURN_KEYS = ("new_tokens", "wall_s", "steps", "accept_lengths")

# Spec-Bench's tasks and the categories of its mt_bench task, as its evaluation/speed.py names them
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MT_BENCH_SETS = ("mt_bench", "eagle_mt_bench", "spec_bench")  # datasets whose MT-Bench categories are MT-Bench's
# our category -> Spec-Bench's category (= its task), or None: no Spec-Bench task (written as it is; "overall" only)
CATEGORIES: dict[str, str | None] = {
    "translation": "translation",  # spec_bench (WMT14 DE-EN)
    "summarization": "summarization",  # spec_bench, eagle_cnndm (CNN/DailyMail, as Spec-Bench's)
    "summarisation": "summarization",  # builtin
    "qa": "qa",  # spec_bench, eagle_qa (Natural Questions, as Spec-Bench's)
    "math_reasoning": "math_reasoning",  # spec_bench (GSM8K)
    "math": "math_reasoning",  # builtin, gsm8k, eagle_gsm8k: word problems, as Spec-Bench's GSM8K task
    "rag": "rag",  # spec_bench
    "chat": None,  # builtin: general chat, not MT-Bench's questions
    "code": None,  # builtin, humaneval, eagle_humaneval: Spec-Bench has no code task
    "eagle_alpaca": None,  # eagle_alpaca (its questions have no category; the loader names them after the set)
}


def spec_bench_category(dataset: str, category: str) -> str | None:
    """Spec-Bench's category for one of ours (see the module docstring); None where CATEGORIES does not name it."""
    if dataset in MT_BENCH_SETS and category in MT_BENCH_CATEGORIES:
        return category
    if category not in CATEGORIES:
        return None
    return CATEGORIES[category] or category


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
    were skipped (they have no answers), and {category: prompts} of those with no Spec-Bench task."""
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
    replaced whole); returns the files written and one-line notes."""
    from graft.records.reader import RecordError, run_dirs

    from graft.records.reader import check_export_paths

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
    for run, files, texted, skipped in checked:
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


# --- import: Spec-Bench / EAGLE answer files as a run folder ----------------------------------------------------

IMPORTED = " (imported)"  # ends every imported method's name, so tables and figures show which rows were imported
BASELINE_NAMES = ("vanilla", "baseline", "base", "ar")  # a file whose method part is one of these is the baseline
TEMPERATURE = re.compile(r"-temp(?:erature)?-(\d+(?:\.\d+)?)")
DTYPES = re.compile(r"-(?:float16|bfloat16|float32|fp16|bf16|fp32)(?=-|$)")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_answer_file(path: Path) -> dict:
    """{question_id: answer} of one answer file, the last answer of a question kept (as Spec-Bench's and EAGLE's
    reorg_answer_file keep it), in the order questions first appear."""
    from graft.records.reader import RecordError

    answers: dict = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RecordError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); answer files are UTF-8 JSONL"
        ) from None
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
    from graft.records.reader import RecordError
    from graft.report.foreign import side_of, write_foreign_run
    from graft.run.provenance import code

    answers = Path(answers)
    if not answers.is_dir():
        raise RecordError(f"{answers}: not a folder of answer files (<model>-<method>.jsonl)")
    files = sorted(p for p in answers.glob("*.jsonl") if p.is_file())
    if len(files) < 2:
        raise RecordError(f"{answers}: needs a baseline answer file and at least one method's; found {len(files)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RecordError(f"{out}: exists and is not an empty folder; import into a new one")
    stems = [p.stem for p in files]
    found_model, methods = _names(stems)
    if baseline is not None:
        chosen = [i for i, p in enumerate(files) if p.name == Path(baseline).name]
    else:
        chosen = [i for i, m in enumerate(methods) if any(m == b or m.startswith(f"{b}-") for b in BASELINE_NAMES)]
    if len(chosen) != 1:
        raise RecordError(
            f"{answers}: which file is the baseline? {len(chosen)} of {', '.join(p.name for p in files)} look like"
            f" one ({'/'.join(BASELINE_NAMES)}); pass --baseline FILE"
        )
    (base_index,) = chosen
    model = model or found_model or "imported"
    dataset = dataset or (answers.parent.name if answers.name == "model_answer" else answers.name)
    temperatures = {float(m.group(1)) for stem in stems for m in TEMPERATURE.finditer(stem)}
    notes = []
    if temperature is None:
        if len(temperatures) > 1:
            raise RecordError(f"{answers}: its files were run at temperatures {sorted(temperatures)}; import one")
        if not temperatures:
            notes.append("the file names give no temperature: recorded as 0 (--temperature to set it)")
        temperature = temperatures.pop() if temperatures else 0.0
    read = [read_answer_file(p) for p in files]
    shared = {m for m in methods if methods.count(m) > 1}  # m-graft.jsonl beside m-graft-float16.jsonl
    own = [p.stem.removeprefix(f"{found_model}-") if found_model else p.stem for p in files]
    labels = [f"{own[i] if m in shared else m}{IMPORTED}" for i, m in enumerate(methods)]
    if len(set(labels)) < len(labels):
        raise RecordError(
            f"{answers}: two answer files would be one method; rename one ({', '.join(p.name for p in files)})"
        )
    if shared:
        named = sorted(label for label, m in zip(labels, methods) if m in shared)
        notes.append(f"files sharing a method are labelled by their names: {', '.join(named)}")
    partial = sorted(p.name for p, answered in zip(files, read) if any(a.get("partial") for a in answered.values()))
    if partial:
        notes.append(f"{', '.join(partial)}: exported from an unfinished run (partial); imported as partial")
    common = [qid for qid in read[base_index] if all(qid in answered for answered in read)]
    if not common:
        raise RecordError(f"{answers}: no question is answered in every file")
    dropped = len(set().union(*map(set, read))) - len(common)
    if dropped:
        notes.append(f"{dropped} questions not answered in every file were left out")
    steps_from: dict[str, str] = {}
    records = []
    for index, qid in enumerate(common):
        base_answer = read[base_index][qid]
        where = lambda i: f"{files[i]}:{read[i][qid]['_line']}"  # noqa: E731
        base_turns, how = imported_turns(base_answer, where(base_index))
        steps_from["ar"] = how
        baseline_side = side_of(base_turns)
        entries = {}
        for i, label in enumerate(labels):
            if i == base_index:
                continue
            turns, how = imported_turns(read[i][qid], where(i))
            steps_from[label] = how
            if len(turns) != len(base_turns):
                raise RecordError(f"{where(i)}: {len(turns)} turns, the baseline's answer {len(base_turns)}")
            side = side_of(turns)
            b_tps = baseline_side["totals"]["tokens_per_s"]
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
    sources = [
        {
            "file": p.name,
            "sha256": _sha256(p),
            "role": "baseline" if i == base_index else "method",
            "method": "ar" if i == base_index else labels[i],
            "answers": len(read[i]),
        }
        for i, p in enumerate(files)
    ]
    imported = {
        "format": "spec-bench",
        "source": str(answers.resolve()),
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
    written = write_foreign_run(out, records, meta=meta, config=config, run=run, suffix=IMPORTED, partial=bool(partial))
    return written, notes
