"""Spec-Bench's answer-file format, shared by the export (specbench_export.py) and the import
(specbench_import.py): an answer line's layout, and how our categories and prompt ids map onto Spec-Bench's
(CATEGORIES, spec_bench_category, question_id).

An answer file holds one JSON line per question, in the layout Spec-Bench's evaluation/eval.py
(`get_model_answers`) writes:

    {"question_id": 81, "category": "writing", "answer_id": "...", "model_id": "<model>-<method>",
     "choices": [{"index": 0, "turns": [text, ...], "decoding_steps": [steps, ...], "new_tokens": [n, ...],
                  "wall_time": [seconds, ...], "accept_lengths": [tokens of each verification step, all turns]}],
     "tstamp": 1700000000.0}

`turns`, `decoding_steps`, `new_tokens` and `wall_time` hold one entry per turn; `accept_lengths` is one flat list
over the turns, as Spec-Bench extends it turn by turn (evaluation/speed.py sums the first three per question and
averages the last over all steps).
"""

from __future__ import annotations

import re

BASELINE = "vanilla"  # Spec-Bench's name for plain autoregressive decoding (evaluation/inference_baseline.py)

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
    """Spec-Bench's category for one of ours, so that speed.py's tasks (mt_bench, translation, summarization, qa,
    math_reasoning, rag) hold what they should: MT-Bench's eight categories stay as they are in an MT-Bench set
    (speed.py's mt_bench task), every other category is mapped by CATEGORIES (the built-in set's and GSM8K's
    `math` is math_reasoning, not MT-Bench's math); a category mapped to None has no Spec-Bench task and is
    written as it is (speed.py's "overall" counts it, no task does). None where CATEGORIES does not name it."""
    if dataset in MT_BENCH_SETS and category in MT_BENCH_CATEGORIES:
        return category
    if category not in CATEGORIES:
        return None
    return CATEGORIES[category] or category


def question_id(record: dict, dataset: str):
    """The dataset's own id of a record's prompt: a record's `question_id` where it has one, else what follows
    `<dataset>-` in its `id` (an integer where it is one), else the number that ends the id, else the id itself.
    (Where those are not unique in a run, as the built-in set's chat-1, code-1, ..., the export writes every
    record's `id` as it is.)"""
    if record.get("question_id") is not None:
        return record["question_id"]
    rid = str(record.get("id"))
    own = rid[len(dataset) + 1 :] if dataset and rid.startswith(f"{dataset}-") else None
    if own:
        return int(own) if re.fullmatch(r"-?\d+", own) else own
    number = re.search(r"(\d+)$", rid)
    return int(number.group(1)) if number else rid
