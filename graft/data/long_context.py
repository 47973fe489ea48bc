"""Long-context prompt sets: LongBench subsets, PG-19 continuations, and `long_synthetic`, which cuts
prompts of a requested token length (counted with the target's tokenizer, chat template included) from
a long text, with a task that asks for a long answer.
"""

from __future__ import annotations

import json
from pathlib import Path

from graft.config.schema import DatasetConfig
from graft.data.prompt import DatasetError, Prompt
from graft.data.sources import hub_records, local_file, read_jsonl, read_utf8

# Our own wording for the LongBench tasks that produce long outputs (the ones the Graft paper uses).
LONGBENCH_TASKS = {
    "gov_report": "Below is a report from a government agency. Write a detailed summary of it.\n\n{context}\n\nNow write the summary.",
    "qmsum": "Below is the transcript of a meeting, followed by a question. Answer the question from the transcript.\n\n{context}\n\nQuestion: {input}\nAnswer:",
    "multi_news": "Below are several news articles on one story. Write a single detailed summary of them.\n\n{context}\n\nNow write the summary.",
    "lcc": "Continue the following code with the next line.\n\n{context}",
    "repobench-p": "Below are files from a code repository, then an unfinished file. Continue the unfinished file with the next line.\n\n{context}{input}",
}

SYNTHETIC_TASKS = {
    "continue": "Here is the beginning of a long collection of essays. Continue writing from where it stops, in the same voice.\n\n{passage}",
    "summarise": "Read the essays below, then write a detailed summary of their main arguments.\n\n{passage}\n\nNow write the summary.",
    "qa": "Read the essays below. What are the most important pieces of advice the author gives, and why? Answer at length, citing the essays.\n\n{passage}",
}


def longbench(cfg: DatasetConfig, data_root: str | None, chat) -> list[Prompt]:
    subsets = cfg.subsets or list(LONGBENCH_TASKS)
    unknown = [s for s in subsets if s not in LONGBENCH_TASKS]
    if unknown:
        raise DatasetError(f"dataset.subsets names {unknown}; allowed LongBench subsets: {', '.join(LONGBENCH_TASKS)}")
    root = local_file(cfg, data_root)
    prompts = []
    for subset in subsets:
        if root is not None:
            path = root / f"{subset}.jsonl" if root.is_dir() else root
            if not path.exists():
                raise DatasetError(f"{path} does not exist (LongBench layout: a folder with <subset>.jsonl files)")
            rows = [row for _, row in read_jsonl(path)]
        else:
            rows = hub_records(cfg, data_root, config=subset)
        for i, row in enumerate(rows):
            if root is not None and root.is_file() and row.get("dataset", subset) != subset:
                continue
            turn = LONGBENCH_TASKS[subset].format(context=row.get("context", ""), input=row.get("input", ""))
            meta = {"answers": row.get("answers"), "source_length": row.get("length")}
            prompts.append(Prompt(id=f"{subset}-{row.get('_id', i)}", category=subset, turns=[turn], meta=meta))
    return prompts


def _read_text(path: Path) -> str:
    if path.suffix in (".jsonl", ".gz"):
        return "\n\n".join(row.get("text", "") for _, row in read_jsonl(path))
    text = read_utf8(path)
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise DatasetError(f"{path}: expected a JSON object with a 'text' field (a string)")
        return data["text"]
    return text


def cut_to_length(chat, template: str, text: str, start_char: int, length: int) -> tuple[str, int]:
    """The task prompt whose rendered chat prompt has about `length` tokens; returns (turn, tokens)."""
    overhead = len(chat.prompt_ids([{"role": "user", "content": template.format(passage="")}]))
    window = text[start_char : start_char + 8 * length]
    ids = chat.encode(window)
    if len(ids) + overhead < length:
        raise DatasetError(f"the text has fewer than {length} tokens after character {start_char}; use a longer file")
    need = length - overhead
    for _ in range(4):  # re-tokenising a cut can shift a few tokens; correct and retry
        turn = template.format(passage=chat.decode(ids[:need]))
        actual = len(chat.prompt_ids([{"role": "user", "content": turn}]))
        if abs(actual - length) <= max(1, length // 200):
            break
        need += length - actual
    return turn, actual


def long_synthetic(cfg: DatasetConfig, data_root: str | None, chat) -> list[Prompt]:
    path = local_file(cfg, data_root)
    if path is None:
        raise DatasetError(
            f"dataset '{cfg.name}' needs a long text file: pass dataset.path=<.json with a 'text' field, .txt or .jsonl>"
            f" (looked for <data_root>/{cfg.local_name})"
        )
    return _synthetic_from_texts(cfg, chat, [(path.stem, _read_text(path))])


def pg19(cfg: DatasetConfig, data_root: str | None, chat) -> list[Prompt]:
    path = local_file(cfg, data_root)
    if path is not None:
        files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
        books = [(p.stem, _read_text(p)) for p in files]
    else:
        rows = hub_records(cfg, data_root)
        books = [(row.get("short_book_title", str(i)), row["text"]) for i, row in enumerate(rows)]
    return _synthetic_from_texts(cfg, chat, books)


def _synthetic_from_texts(cfg: DatasetConfig, chat, texts: list[tuple[str, str]]) -> list[Prompt]:
    prompts = []
    for task in cfg.tasks:
        if task not in SYNTHETIC_TASKS:
            raise DatasetError(f"dataset.tasks names '{task}'; allowed: {', '.join(SYNTHETIC_TASKS)}")
    for length in cfg.lengths:
        for k, task in enumerate(cfg.tasks):
            title, text = texts[k % len(texts)]
            start = _paragraph_start(text, (k * 104729 * max(1, length // 1024)) % max(1, len(text) - 8 * length))
            turn, actual = cut_to_length(chat, SYNTHETIC_TASKS[task], text, start, length)
            prompts.append(
                Prompt(
                    id=f"{cfg.name}-{length}-{task}",
                    category=f"{round(length / 1024)}k",
                    turns=[turn],
                    meta={
                        "requested_tokens": length,
                        "prompt_tokens": actual,
                        "task": task,
                        "source": title,
                        "start_char": start,
                    },
                )
            )
    return prompts


def _paragraph_start(text: str, guess: int) -> int:
    cut = text.find("\n\n", guess)
    return guess if cut < 0 else cut + 2
