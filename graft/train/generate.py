"""The generate stage both trainers share: the target answers non-evaluation requests itself, greedily
(graft/train/prompts.py): GSM8K *train* questions, questions it writes about a list of topics, composed
prose and code requests; then second turns after its own answers (follow-ups, reworks, code reviews,
summaries of passages it wrote). One JSON line per conversation in conversations.jsonl, appended as
batches finish, so a rerun continues where it stopped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

from graft.schema import ConfigError
from graft.train.prompts import (
    CODE_FOLLOWUPS,
    CODE_REVIEWS,
    COMPOSED,
    FOLLOWUPS,
    REWORKS,
    SUMMARIES,
    TOPICS,
    code_requests,
    first_code_block,
    passage_groups,
    summary_pairs,
    templated_requests,
)


def jsonl(path: Path) -> list[dict]:
    """The JSON lines of `path` ([] when it does not exist); a line that is not JSON names the file and line
    (a torn last line of a killed run included: delete that line to continue)."""
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None
    return records


def _chat_ids(chat, text: str) -> list[int]:
    return chat.prompt_ids([{"role": "user", "content": text}])


@torch.inference_mode()
def _generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int]) -> list[list[int]]:
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else min(stop_ids)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
    )
    answers = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, tok in enumerate(row) if tok in stop_ids), len(row))
        answers.append(row[:cut])
    return answers


def stage_generate(cfg, loaded, out: Path) -> None:
    path = out / "conversations.jsonl"
    done = {r["id"] for r in jsonl(path)}
    model, tokenizer, chat = loaded.target.model, loaded.target.tokenizer, loaded.chat
    data = cfg.train.data
    jobs = []
    gsm = Path(data.gsm8k_train)
    if gsm.exists():
        for i, row in enumerate(jsonl(gsm)[: data.num_gsm8k]):
            if not isinstance(row, dict) or not isinstance(row.get("question"), str):
                raise ConfigError(f"{gsm}: record {i + 1} has no 'question' (GSM8K JSON lines: question, answer)")
            jobs.append((f"gsm8k-train-{i}", row["question"]))
    else:
        print(f"note: {gsm} not found; training without GSM8K train questions")
    jobs += [(f"composed-{i}", text) for i, text in enumerate(COMPOSED)]
    templated = templated_requests(cfg.train.seed)[: data.num_templated]
    jobs += [(f"templated-{i}", text) for i, text in enumerate(templated)]
    questions_path = out / "self_questions.jsonl"
    asked = jsonl(questions_path)
    if len(asked) < data.num_self_questions:  # the target writes its own questions first
        styles = ["a beginner", "a student", "a curious child", "an expert", "a traveller"]
        seeds = [(t, s) for t in TOPICS for s in styles][: data.num_self_questions]
        todo = seeds[len(asked) :]
        bar = tqdm(total=len(todo), desc="target writes questions")
        for start in range(0, len(todo), data.generate_batch):
            chunk = todo[start : start + data.generate_batch]
            prompts = [
                _chat_ids(
                    chat,
                    f"Write one question that {s} might ask an AI assistant about {t}. Reply with the question only.",
                )
                for t, s in chunk
            ]
            for (t, s), answer in zip(chunk, _generate(model, tokenizer, prompts, 48, loaded.stop_ids)):
                text = chat.decode(answer).strip().split("\n")[0]
                with open(questions_path, "a") as f:
                    f.write(json.dumps({"topic": t, "style": s, "question": text}) + "\n")
            bar.update(len(chunk))
        bar.close()
        asked = jsonl(questions_path)
    jobs += [(f"self-{i}", q["question"]) for i, q in enumerate(asked) if len(q["question"]) > 10]
    first_turns = [(jid, [{"role": "user", "content": text}]) for jid, text in jobs if jid not in done]
    _answer_all(cfg, loaded, path, first_turns, "target answers")
    # second turns: a follow-up to a seeded choice of the non-GSM8K first turns, after the target's own answer
    answered = {r["id"]: r["answer_ids"] for r in jsonl(path)}
    candidates = [(jid, text) for jid, text in jobs if not jid.startswith("gsm8k") and jid in answered]
    random.Random(cfg.train.seed).shuffle(candidates)
    followups = []
    for i, (jid, text) in enumerate(candidates[: data.num_followups]):
        if f"followup-{jid}" not in answered:
            first_answer = chat.decode(answered[jid])
            turns = [{"role": "user", "content": text}, {"role": "assistant", "content": first_answer}]
            followups.append((f"followup-{jid}", turns + [{"role": "user", "content": FOLLOWUPS[i % len(FOLLOWUPS)]}]))
    _answer_all(cfg, loaded, path, followups, "target answers follow-ups")
    # reworks: a seeded choice of the same first turns' answers, pasted into a new single turn
    random.Random(cfg.train.seed + 1).shuffle(candidates)
    reworks = []
    for i, (jid, _) in enumerate(candidates[: data.num_reworks]):
        if f"rework-{jid}" not in answered:
            request = REWORKS[i % len(REWORKS)].format(text=chat.decode(answered[jid]).strip())
            reworks.append((f"rework-{jid}", [{"role": "user", "content": request}]))
    _answer_all(cfg, loaded, path, reworks, "target answers reworks")
    _generate_code_and_passages(cfg, loaded, path)


def _answer_single_turns(cfg, loaded, path: Path, jobs: list[tuple[str, str]], answered: dict, desc: str) -> None:
    """The target answers each (id, user turn) not answered yet."""
    todo = [(jid, [{"role": "user", "content": text}]) for jid, text in jobs if jid not in answered]
    _answer_all(cfg, loaded, path, todo, desc)


def _generate_code_and_passages(cfg, loaded, path: Path) -> None:
    """Code turns (`code_requests`), their follow-ups and reviews of the target's own code;
    passages the target writes (`passage_groups`) and summaries of them (SUMMARIES); counts from train.data."""
    data, chat = cfg.train.data, loaded.chat
    answered = {r["id"]: r["answer_ids"] for r in jsonl(path)}
    code = [(f"code-{i}", text) for i, text in enumerate(code_requests(cfg.train.seed)[: data.num_code])]
    _answer_single_turns(cfg, loaded, path, code, answered, "target answers code")
    answered = {r["id"]: r["answer_ids"] for r in jsonl(path)}
    todo = []
    for i, (jid, text) in enumerate(code[: data.num_code_followups]):
        if f"followup-{jid}" not in answered:
            turns = [{"role": "user", "content": text}, {"role": "assistant", "content": chat.decode(answered[jid])}]
            todo.append(
                (f"followup-{jid}", turns + [{"role": "user", "content": CODE_FOLLOWUPS[i % len(CODE_FOLLOWUPS)]}])
            )
    _answer_all(cfg, loaded, path, todo, "target answers code follow-ups")
    todo = []
    reviewed = [(jid, first_code_block(chat.decode(answered[jid]))) for jid, _ in reversed(code)]
    reviewed = [(jid, block) for jid, block in reviewed if block and len(block) < 1200]
    for i, (jid, block) in enumerate(reviewed[: data.num_code_reviews]):
        if f"review-{jid}" not in answered:
            todo.append(
                (f"review-{jid}", [{"role": "user", "content": CODE_REVIEWS[i % len(CODE_REVIEWS)].format(code=block)}])
            )
    _answer_all(cfg, loaded, path, todo, "target answers code reviews")
    counts = ((data.num_passages, data.num_summaries), (data.num_passages_more, data.num_summaries_more))
    for group, (requests, (num_passages, num_summaries)) in enumerate(zip(passage_groups(cfg.train.seed), counts)):
        tag = "" if group == 0 else "more-"  # the first group's ids are those of earlier rounds
        passages = [(f"passage-{tag}{i}", text) for i, text in enumerate(requests[:num_passages])]
        _answer_single_turns(cfg, loaded, path, passages, answered, "target writes passages")
        answered = {r["id"]: r["answer_ids"] for r in jsonl(path)}
        todo = []
        for i, (p, shape) in enumerate(summary_pairs(num_summaries, len(passages), len(SUMMARIES))):
            jid = passages[p][0]
            if f"summary-{tag}{i}-{jid}" not in answered:
                request = SUMMARIES[shape].format(text=chat.decode(answered[jid]).strip())
                todo.append((f"summary-{tag}{i}-{jid}", [{"role": "user", "content": request}]))
        _answer_all(cfg, loaded, path, todo, "target answers summaries")


def _answer_all(cfg, loaded, path: Path, todo: list[tuple[str, list[dict]]], desc: str) -> None:
    """The target answers each (id, messages) greedily; one JSON line per conversation, appended as batches finish."""
    data = cfg.train.data
    bar = tqdm(total=len(todo), desc=desc)
    for start in range(0, len(todo), data.generate_batch):
        chunk = todo[start : start + data.generate_batch]
        prompts = [loaded.chat.prompt_ids(messages) for _, messages in chunk]
        answers = _generate(loaded.target.model, loaded.target.tokenizer, prompts, data.max_new_tokens, loaded.stop_ids)
        with open(path, "a") as f:
            for (jid, _), p, a in zip(chunk, prompts, answers):
                f.write(json.dumps({"id": jid, "prompt_ids": p, "answer_ids": a}) + "\n")
        bar.update(len(chunk))
    bar.close()
