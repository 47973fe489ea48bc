"""Train an EAGLE-3 head for a target of this harness (Hydra config: configs/train.yaml, configs/train/).

    python scripts/train_eagle3.py [model=smollm2_135m] [train.stage=all] [train.fit.max_minutes=60]

Stages, each resumable (rerun the same command to continue):
- generate: the target answers non-evaluation prompts itself (greedy): GSM8K *train* questions,
  questions it writes about a list of topics, and code / prose requests composed for this project;
  then second turns: a composed follow-up (FOLLOWUPS) after its own answer to some of those first turns;
- features: one target pass per conversation records the fused features (inputs of the head's layers);
- fit: training-time test over `ttt_steps` unrolled steps (graft/eagle/train.py), checkpointing;
- export: the head in the EAGLE layout (config.json + model.safetensors), loadable by method=eagle3.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("GOMP_SPINCOUNT", "100000000")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from graft.cpu.threads import prefer_huge_pages  # noqa: E402  (imports no torch)

prefer_huge_pages()  # as run.py asks, before torch allocates

import hydra  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

from graft.backends import HiddenTap  # noqa: E402
from graft.config import HardwareConfig, ModelConfig, register_schemas  # noqa: E402
from graft.schema import coerce_dataclass  # noqa: E402

TOPICS = [
    "cooking",
    "gardening",
    "personal finance",
    "history of science",
    "astronomy",
    "learning a language",
    "running",
    "photography",
    "climate",
    "sleep",
    "job interviews",
    "writing fiction",
    "electric cars",
    "birds",
    "chess",
    "budget travel",
    "ancient Rome",
    "volcanoes",
    "the human heart",
    "recycling",
    "music theory",
    "coffee",
    "time management",
    "dogs",
    "oceans",
    "bicycles",
    "public speaking",
    "painting",
    "the internet",
    "renting a flat",
    "first aid",
    "board games",
    "mountains",
    "tea",
    "saving energy at home",
    "friendship",
    "mathematics puzzles",
    "trains",
    "weather forecasts",
    "bread",
]
# Round 6 of the block drafter (issue 16): forty more everyday topics, crossed with TEMPLATES and PASSAGES
# into requests appended after the earlier ones (templated_requests, passage_groups), so earlier ids keep
# their texts. None echoes a prompt of an evaluation set.
TOPICS_MORE = [
    "museums",
    "camping",
    "knitting",
    "the solar system",
    "video games",
    "yoga",
    "city parks",
    "jazz",
    "architecture",
    "cats",
    "swimming",
    "podcasts",
    "farming",
    "rivers",
    "deserts",
    "the printing press",
    "smartphones",
    "composting",
    "origami",
    "dinosaurs",
    "solar panels",
    "vaccines",
    "public transport",
    "football",
    "baking cakes",
    "meditation",
    "learning to code",
    "volunteering",
    "robots",
    "ancient Egypt",
    "forests",
    "caves",
    "kites",
    "the Olympic Games",
    "cheese",
    "airplanes",
    "lighthouses",
    "nutrition",
    "birthday parties",
    "snow",
]
COMPOSED = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Write a short poem about autumn leaves.",
    "Write a short story about a robot who learns to paint.",
    "Describe your ideal weekend in a few paragraphs.",
    "Write a Python function that counts the words in a text file.",
    "Explain recursion to a beginner programmer.",
    "Write a SQL query that lists all employees hired after 2020 from a table employees(name, hire_date).",
    "Write a letter to a neighbour asking them to water your plants while you travel.",
    "Explain how a refrigerator keeps food cold.",
    "Write a Python function that checks whether a number is prime.",
    "Summarise the plot of a detective story you invent, in one paragraph.",
    "List five tips for writing clear emails and explain each.",
    "Write a bash command that finds all .txt files in a folder and counts their lines.",
    "Explain what a hash table is and why lookups are fast.",
    "Write a product description for a reusable water bottle.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Describe how plants make food from sunlight.",
]

# Request shapes composed for this project, crossed with TOPICS: prose, lists, explanation, role-play,
# letters, comparison and code-adjacent answers, the kinds of turns a chat assistant writes.
TEMPLATES = [
    "Write a short essay about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give five practical tips about {t}, with one sentence on each.",
    "Write a short poem about {t}.",
    "What are the most common mistakes beginners make with {t}, and how can they avoid them?",
    "Write an email to a friend inviting them to try {t} with you.",
    "Pretend you are a guide who knows everything about {t}. Introduce yourself and the subject.",
    "Compare two different approaches to {t} and say which you would recommend.",
    "Summarise the history of {t} in a few paragraphs.",
    "Write a step-by-step plan for someone who wants to get better at {t} in one month.",
    # round 4: more writing and role-play shapes
    "Write a persuasive blog post about {t}.",
    "You are a well-known expert on {t} opening a public talk. Write the first part of your speech.",
    "Write a short dialogue between two friends who disagree about {t}.",
    "Describe a day in the life of someone whose job involves {t}.",
    "Write a short newsletter for a local club about {t}.",
    "Answer in the voice of a cheerful pirate: what do you think of {t}?",
    "Write a review of an imaginary book about {t}.",
    "Create a three-question quiz about {t} and give the answers.",
    "Write a short story in which {t} changes someone's life.",
    "Write a social media post that gets people interested in {t}.",
]

# Second turns composed for this project: the follow-ups a chat user sends after a first answer
# (rewrite, shorten, restyle, extend, critique), so that the head also sees turns that lean on context.
FOLLOWUPS = [
    "Rewrite your previous answer in a more formal tone.",
    "Summarise your answer in three bullet points.",
    "Make your answer half as long, keeping the key points.",
    "Now explain the same thing to a five-year-old.",
    "Add a concrete example to your answer.",
    "Turn your answer into a short poem.",
    "What are the weaknesses of what you just wrote? Then give an improved version.",
    "Rewrite your answer as a dialogue between a teacher and a student.",
    "Give your answer a title and write a one-sentence summary of it.",
    "Continue from where you stopped, adding two more ideas.",
    "Rewrite your answer so that it would fit in a short text message.",
    "Now argue the opposite point of view.",
]
# Single turns that paste one of the target's own first answers back with a request to rework it: the
# summarise / restate / explain-this-text turns of chat benchmarks, where the answer leans on the prompt.
REWORKS = [
    "Summarise the following text in two or three sentences.\n\n{text}",
    "List the main points of this text as bullet points.\n\n{text}",
    "Give this text a title and explain its main idea in one paragraph.\n\n{text}",
    "Rewrite the following text in simpler words.\n\n{text}",
]


# Programming tasks composed for this project (round 5 of the data), crossed with CODE_SHAPES: the code
# turns of chat benchmarks, where answers are mostly code whose next token follows from the prompt.
CODE_TASKS = [
    "reverses the order of the words in a sentence",
    "returns the largest number in a list without using max",
    "counts how many vowels a string contains",
    "removes every duplicate from a list while keeping the original order",
    "returns the factorial of n",
    "checks whether two strings are anagrams of each other",
    "converts a temperature from Celsius to Fahrenheit",
    "returns the second smallest number in a list",
    "flattens a list of lists into one list",
    "counts how often each word appears in a text and returns a dictionary",
    "returns the sum of the digits of an integer",
    "checks whether a year is a leap year",
    "finds the longest word in a sentence",
    "returns the greatest common divisor of two integers",
    "splits a list into chunks of a given size",
    "capitalises the first letter of every word in a string",
    "returns all the even numbers from a list",
    "computes the average of a list of numbers",
    "checks whether a list is sorted in ascending order",
    "converts a binary string to an integer",
    "returns the n-th row of Pascal's triangle",
    "finds the index of a value in a sorted list using binary search",
    "rotates a list to the right by k positions",
    "returns the intersection of two lists",
    "checks whether a string contains balanced parentheses",
    "converts a Roman numeral to an integer",
    "returns the median of a list of numbers",
    "counts the lines, words and characters of a text",
    "transposes a matrix given as a list of lists",
    "returns the most common element of a list",
    "merges two dictionaries, adding the values of keys they share",
    "removes all punctuation from a string",
    "generates the first n prime numbers",
    "checks whether a number is a perfect square",
    "returns a list of the running totals of a list",
    "sorts a list of dictionaries by the value of a given key",
    "compresses a string by replacing repeated characters with a count, so aaabb becomes a3b2",
    "checks whether an email address has a valid basic format",
    "returns the number of days between two dates",
    "finds all pairs of numbers in a list that add up to a target",
]
CODE_SHAPES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Explain how it works.",
    "Write a JavaScript function that {t}.",
    "Write a Python function that {t}, with a docstring and type hints.",
    "How would you write a function that {t}? Show the code in Python.",
]
SQL_TASKS = [
    "returns the ten most expensive products from a table products(id, name, price)",
    "counts the orders per customer from a table orders(id, customer_id, total)",
    "lists the students whose average grade is above 80 from a table grades(student_id, course, grade)",
    "finds the employees who earn more than their manager from a table employees(id, name, salary, manager_id)",
    "returns the total sales per month from a table sales(id, sold_at, amount)",
    "lists the books that have never been borrowed from tables books(id, title) and loans(id, book_id, loaned_at)",
    "deletes the duplicate rows of a table emails(id, address), keeping the lowest id",
    "returns the three cities with the most customers from a table customers(id, name, city)",
]
# More programming tasks (round 5 of the block drafter's data), shuffled after the first ones, so that the
# ids of earlier rounds' code turns keep their text.
CODE_TASKS_MORE = [
    "returns the n-th Fibonacci number",
    "checks whether a string is a palindrome, ignoring spaces and case",
    "converts an integer to its binary representation as a string",
    "returns the minimum and maximum of a list in one pass",
    "removes all whitespace from a string",
    "returns the product of all the numbers in a list",
    "checks whether a number is prime",
    "reverses a string without using slicing",
    "returns the keys of a dictionary sorted by their values",
    "counts the uppercase and lowercase letters in a string",
    "returns the cumulative product of a list",
    "groups a list of words by their first letter",
    "returns the difference between the largest and smallest values in a list",
    "checks whether all the elements of a list are unique",
    "converts a string in snake_case to camelCase",
    "returns the k largest numbers of a list in descending order",
    "computes the dot product of two vectors given as lists",
    "returns every substring of a string that is a palindrome",
    "shuffles a list in place using the Fisher-Yates algorithm",
    "returns the number of set bits in an integer",
    "checks whether a string is a valid IPv4 address",
    "merges two sorted lists into one sorted list",
    "returns the first character of a string that does not repeat",
    "computes the area of a circle, a rectangle or a triangle depending on its arguments",
    "returns the sum of all the multiples of 3 or 5 below n",
    "converts a list of pairs into a dictionary",
    "finds the missing number in a list containing 1 to n with one number missing",
    "returns the length of the longest run of equal elements in a list",
    "validates that a password has at least eight characters, a digit and an uppercase letter",
    "returns the words of a sentence sorted by length",
    "counts the number of islands in a grid of zeros and ones",
    "converts a number of seconds into hours, minutes and seconds",
    "returns a new list with every element of a list squared",
    "finds the common prefix of a list of strings",
    "implements a stack with push, pop and peek",
    "checks whether one string is a rotation of another",
    "returns the mean, median and mode of a list of numbers",
    "removes the vowels from a string",
    "returns the sum of the elements on the main diagonal of a square matrix",
    "finds the second largest word in a sentence by length",
]
# Second turns after the target's own code (composed for this project).
CODE_FOLLOWUPS = [
    "Add comments that explain each step of your code.",
    "Write three unit tests for your function.",
    "Make your function handle invalid input, and explain what you changed.",
    "Show two example calls to your function and what they return.",
    "Rewrite your function so that it is shorter.",
    "What is the time complexity of your solution? Can it be improved?",
    "Now write the same function in JavaScript.",
    "Add type hints to your function and describe its parameters.",
]
# Single turns that paste the target's own code back (the first fenced block of one of its answers).
CODE_REVIEWS = [
    "Here is a piece of code:\n\n{code}\n\nExplain what it does, step by step.",
    "Here is some code:\n\n{code}\n\nDoes it have any bugs or missed edge cases? Rewrite it to fix them.",
    "Add comments to this code:\n\n{code}",
    "What happens if this function gets unusual input?\n\n{code}\n\nImprove it so that it handles such input.",
]
# Passages the target writes itself, then pasted into summarising and fact-listing turns (SUMMARIES):
# the summarisation turns of chat benchmarks, where the answer copies and condenses the prompt.
PASSAGES = [
    "Write a short factual paragraph about {t}.",
    "Write a short news report about a local event related to {t}.",
    "Write an informative paragraph explaining one surprising fact about {t}.",
]
SUMMARIES = [
    "Summarise this passage in one sentence.\n\n{text}",
    "Summarise the following text in three bullet points.\n\n{text}",
    "Read this text and list its key facts.\n\n{text}",
    "Give a short summary of the passage below.\n\n{text}",
    "What is the main point of this passage? Answer in two sentences.\n\n{text}",
    "Write a headline for this report and then summarise it briefly.\n\n{text}",
]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


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
    done = {r["id"] for r in _jsonl(path)}
    model, tokenizer, chat = loaded.target.model, loaded.target.tokenizer, loaded.chat
    data = cfg.train.data
    jobs = []
    gsm = Path(data.gsm8k_train)
    if gsm.exists():
        for i, line in enumerate(gsm.read_text().splitlines()[: data.num_gsm8k]):
            jobs.append((f"gsm8k-train-{i}", json.loads(line)["question"]))
    else:
        print(f"note: {gsm} not found; training without GSM8K train questions")
    jobs += [(f"composed-{i}", text) for i, text in enumerate(COMPOSED)]
    templated = templated_requests(cfg.train.seed)[: data.num_templated]
    jobs += [(f"templated-{i}", text) for i, text in enumerate(templated)]
    questions_path = out / "self_questions.jsonl"
    asked = _jsonl(questions_path)
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
        asked = _jsonl(questions_path)
    jobs += [(f"self-{i}", q["question"]) for i, q in enumerate(asked) if len(q["question"]) > 10]
    first_turns = [(jid, [{"role": "user", "content": text}]) for jid, text in jobs if jid not in done]
    _answer_all(cfg, loaded, path, first_turns, "target answers")
    # second turns: a follow-up to a seeded choice of the non-GSM8K first turns, after the target's own answer
    answered = {r["id"]: r["answer_ids"] for r in _jsonl(path)}
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


def _first_code_block(text: str) -> str | None:
    """The first fenced code block of an answer, without its fences (None when it has none)."""
    parts = text.split("```")
    if len(parts) < 3:
        return None
    block = parts[1].split("\n", 1)
    code = block[1] if len(block) == 2 and block[0].strip().isidentifier() else parts[1]
    return code.strip() or None


def summary_pairs(count: int, passages: int, shapes: int) -> list[tuple[int, int]]:
    """(passage, request shape) for `count` summarising turns: each passage in turn, its shape moving on by
    one every time the passages come round again, so no pair repeats (at most passages x shapes of them).
    The first `passages` pairs are (i, i % shapes)."""
    count = min(count, passages * shapes)
    return [(i % passages, (i % passages + i // passages) % shapes) for i in range(count)]


def templated_requests(seed: int) -> list[str]:
    """TEMPLATES x TOPICS in template order, then TEMPLATES x TOPICS_MORE shuffled (earlier ids keep their texts)."""
    more = [template.format(t=topic) for template in TEMPLATES for topic in TOPICS_MORE]
    random.Random(seed + 5).shuffle(more)
    return [template.format(t=topic) for template in TEMPLATES for topic in TOPICS] + more


def passage_groups(seed: int) -> list[list[str]]:
    """The passage requests in two groups, each shuffled: PASSAGES x TOPICS, then PASSAGES x TOPICS_MORE."""
    groups = []
    for topics, offset in ((TOPICS, 3), (TOPICS_MORE, 6)):
        requests = [shape.format(t=topic) for topic in topics for shape in PASSAGES]
        random.Random(seed + offset).shuffle(requests)
        groups.append(requests)
    return groups


def code_requests(seed: int) -> list[str]:
    """Every code request in the order the generate stage takes them: CODE_SHAPES x CODE_TASKS and SQL_TASKS
    shuffled, then CODE_SHAPES x CODE_TASKS_MORE shuffled (so that adding tasks keeps earlier ids' texts)."""
    first = [shape.format(t=task) for task in CODE_TASKS for shape in CODE_SHAPES]
    first += [f"Write a SQL query that {task}." for task in SQL_TASKS]
    random.Random(seed + 2).shuffle(first)
    more = [shape.format(t=task) for task in CODE_TASKS_MORE for shape in CODE_SHAPES]
    random.Random(seed + 4).shuffle(more)
    return first + more


def _answer_single_turns(cfg, loaded, path: Path, jobs: list[tuple[str, str]], answered: dict, desc: str) -> None:
    """The target answers each (id, user turn) not answered yet."""
    todo = [(jid, [{"role": "user", "content": text}]) for jid, text in jobs if jid not in answered]
    _answer_all(cfg, loaded, path, todo, desc)


def _generate_code_and_passages(cfg, loaded, path: Path) -> None:
    """Code turns (`code_requests`), their follow-ups and reviews of the target's own code;
    passages the target writes (`passage_groups`) and summaries of them (SUMMARIES); counts from train.data."""
    data, chat = cfg.train.data, loaded.chat
    answered = {r["id"]: r["answer_ids"] for r in _jsonl(path)}
    code = [(f"code-{i}", text) for i, text in enumerate(code_requests(cfg.train.seed)[: data.num_code])]
    _answer_single_turns(cfg, loaded, path, code, answered, "target answers code")
    answered = {r["id"]: r["answer_ids"] for r in _jsonl(path)}
    todo = []
    for i, (jid, text) in enumerate(code[: data.num_code_followups]):
        if f"followup-{jid}" not in answered:
            turns = [{"role": "user", "content": text}, {"role": "assistant", "content": chat.decode(answered[jid])}]
            todo.append(
                (f"followup-{jid}", turns + [{"role": "user", "content": CODE_FOLLOWUPS[i % len(CODE_FOLLOWUPS)]}])
            )
    _answer_all(cfg, loaded, path, todo, "target answers code follow-ups")
    todo = []
    reviewed = [(jid, _first_code_block(chat.decode(answered[jid]))) for jid, _ in reversed(code)]
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
        answered = {r["id"]: r["answer_ids"] for r in _jsonl(path)}
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


@torch.inference_mode()
def stage_features(cfg, loaded, out: Path, layer_ids: list[int]) -> None:
    convs = _jsonl(out / "conversations.jsonl")
    shard_dir = out / "features"
    shard_dir.mkdir(exist_ok=True)
    target = loaded.target
    taps = tuple(HiddenTap(i, "input") for i in layer_ids)
    per_shard = 64
    top_k = cfg.train.data.soft_top_k
    counts = torch.zeros(target.vocab_size, dtype=torch.long)
    for s, start in enumerate(tqdm(range(0, len(convs), per_shard), desc="target features")):
        chunk = convs[start : start + per_shard]
        for c in chunk:
            counts += torch.bincount(torch.tensor(c["answer_ids"], dtype=torch.long), minlength=target.vocab_size)
        shard = shard_dir / f"shard_{s:04d}.pt"
        if shard.exists():  # a short last shard, or one without the soft labels asked for, is redone
            old = torch.load(shard)
            if len(old) == len(chunk) and (top_k == 0 or "soft_ids" in old[0]):
                continue
        records = [feature_record(target, c, taps, cfg.train.data.max_len, top_k) for c in chunk]
        torch.save(records, shard)
    torch.save(counts, out / "token_counts.pt")


def feature_record(target, conversation: dict, taps, max_len: int, top_k: int) -> dict:
    """One target pass over a conversation (prompt + answer, cut to max_len): its tokens, which of them are
    labels (the answer's), the `taps` hidden states in float16 and, with top_k > 0, the soft labels."""
    ids = (conversation["prompt_ids"] + conversation["answer_ids"])[:max_len]
    target.reset(len(ids) + 8)
    encoded = target.prefill(ids, taps, all_logits=top_k > 0)
    valid = [False] * len(conversation["prompt_ids"]) + [True] * len(conversation["answer_ids"])
    record = {"tokens": torch.tensor(ids), "valid": torch.tensor(valid[: len(ids)]), "features": encoded.hidden.half()}
    if top_k > 0:
        record.update(soft_labels(encoded.logits, top_k))
    return record


def soft_labels(logits: torch.Tensor, top_k: int) -> dict:
    """The target's own next-token distribution at every position, its top-k (logits [T, V]): the soft
    labels of a fit, stored as soft_ids [T, k] int32 and soft_probs [T, k] float16."""
    probs, ids = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    return {"soft_ids": ids.int(), "soft_probs": probs.half()}


def _new_head(cfg, loaded, layer_ids, counts):
    from graft.eagle.checkpoint import head_config_for
    from graft.eagle.head import DraftHead
    from graft.eagle.train import draft_vocabulary

    head_cfg = head_config_for(loaded.target.config, "eagle3", cfg.train.head.draft_vocab, layer_ids)
    head = DraftHead(head_cfg)
    d2t, t2d = draft_vocabulary(counts, head_cfg.draft_vocab_size)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return head


def _padded(batch: list[dict], key: str, width: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """records[key] ([T] or [T, ...]) right-padded with zeros along T to `width` and stacked: [B, width, ...]."""
    rows = [r[key] if dtype is None else r[key].to(dtype) for r in batch]
    return torch.stack([torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, width - x.shape[0])) for x in rows])


def fit_loop(
    cfg, module, key: str, records: list[dict], out: Path, step, desc: str, init_from=None, evaluate=None
) -> dict:
    """The fit both trainers share: AdamW, warm-up then a cosine over all epochs (or over
    train.fit.max_minutes with anneal=time), sequences shuffled per epoch, resume from out/checkpoint.pt
    (the module's weights under `key`), a metrics.jsonl line per step, checkpoints every
    `checkpoint_every` steps and at a time budget. step(batch, index) -> (loss, metrics, progress) trains on
    one batch of records: the scalar loss to minimise, the metrics to log after step/epoch/loss/lr, and the
    figures for the progress bar. `init_from`: a checkpoint (its path, or its loaded dict) whose weights
    start a fit that has none yet.
    `evaluate()` -> {"score": higher is better, ...}: run every `fit.eval_every` steps and at the end on
    held-out data; its figures are logged with a `heldout_` prefix and the best-scoring weights are kept in
    out/best.pt (returned as "best": {"step", "score"})."""
    fit = cfg.train.fit
    optimizer = torch.optim.AdamW(
        module.parameters(), lr=fit.lr, betas=(0.9, 0.95), weight_decay=fit.get("weight_decay", 0.0)
    )
    per_epoch = math.ceil(len(records) / fit.batch_sequences)
    total_steps = per_epoch * fit.epochs
    by_time = fit.anneal == "time" and fit.max_minutes is not None
    time_share = [0.0]  # share of max_minutes used, when the cosine anneals over time

    def schedule(index: int) -> float:
        done = max(index / total_steps, time_share[0])
        return min(1.0, (index + 1) / fit.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    ckpt_path = out / "checkpoint.pt"
    state = {"step": 0, "seconds": 0.0}
    if ckpt_path.exists():
        saved = torch.load(ckpt_path, weights_only=False)
        module.load_state_dict(saved[key])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = saved["state"]
        print(f"resumed at step {state['step']} of {total_steps}")
    elif init_from:  # warm start: weights of an earlier run (its path, or its state loaded), fresh optimizer
        saved = init_from if isinstance(init_from, dict) else torch.load(init_from, weights_only=False)
        module.load_state_dict(saved[key] if key in saved else saved)
        print(f"warm start from {fit.get('init_from') or init_from}")
    log_path = out / "metrics.jsonl"
    logger = _wandb(cfg, out)
    if state.get("annealed"):  # a time-annealed fit that already reached its end
        total_steps = state["step"]
    time_share[0] = state["seconds"] / (60 * fit.max_minutes) if by_time else 0.0
    started = time.time()
    bar = tqdm(total=total_steps, initial=state["step"], desc=desc)
    module.train()
    while state["step"] < total_steps:
        epoch, position = divmod(state["step"], per_epoch)
        order = list(range(len(records)))
        random.Random(cfg.train.seed + epoch).shuffle(order)
        batch = [records[i] for i in order[position * fit.batch_sequences : (position + 1) * fit.batch_sequences]]
        loss, metrics, progress = step(batch, state["step"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), fit.grad_clip)
        optimizer.step()
        scheduler.step()
        state["step"] += 1
        record = {"step": state["step"], "epoch": epoch, "loss": float(loss.detach()), "lr": scheduler.get_last_lr()[0]}
        record.update(metrics)
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if logger:
            logger.log(record, step=state["step"])
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **progress)
        elapsed = state["seconds"] + time.time() - started
        time_share[0] = elapsed / (60 * fit.max_minutes) if by_time else 0.0
        if time_share[0] >= 1.0:  # annealed to zero at the time budget: the run is complete
            total_steps, state["annealed"] = state["step"], True
        out_of_time = fit.max_minutes is not None and elapsed > 60 * fit.max_minutes and not by_time
        if evaluate is not None and (state["step"] % fit.eval_every == 0 or state["step"] == total_steps):
            _evaluate_and_keep(module, key, evaluate, state, out, log_path, logger)
            module.train()
        if state["step"] % fit.checkpoint_every == 0 or state["step"] == total_steps or out_of_time:
            saved_state = dict(state, seconds=elapsed)
            torch.save(
                {
                    key: module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "state": saved_state,
                },
                ckpt_path,
            )
        if out_of_time:
            print(
                f"stopped after {elapsed / 60:.1f} minutes at step {state['step']} of {total_steps}; rerun to continue"
            )
            break
    bar.close()
    if logger:
        logger.finish()
    module.eval()
    return {"steps": state["step"], "total_steps": total_steps, "sequences": len(records), "best": state.get("best")}


def _evaluate_and_keep(module, key: str, evaluate, state: dict, out: Path, log_path: Path, logger) -> None:
    """One held-out evaluation: logged, and the weights kept in out/best.pt when they score best so far."""
    module.eval()
    with torch.no_grad():
        figures = evaluate()
    record = {"step": state["step"], **{f"heldout_{k}": v for k, v in figures.items()}}
    best = state.get("best")
    if best is None or figures["score"] > best["score"]:
        state["best"] = {"step": state["step"], "score": figures["score"]}
        torch.save({key: module.state_dict(), "best": state["best"]}, out / "best.pt")
    record["heldout_best_step"] = state["best"]["step"]
    with open(log_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if logger:
        logger.log(record, step=state["step"])
    print(f"step {state['step']}: held-out " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))


def stage_fit(cfg, loaded, out: Path, layer_ids: list[int]) -> dict:
    from graft.eagle.train import ttt_losses

    fit = cfg.train.fit
    records = [r for shard in sorted((out / "features").glob("shard_*.pt")) for r in torch.load(shard)]
    counts = torch.load(out / "token_counts.pt")
    torch.manual_seed(cfg.train.seed)
    head = _new_head(cfg, loaded, layer_ids, counts)
    embed = loaded.target.embed
    weights = [fit.step_weight**j for j in range(fit.ttt_steps)]
    soft = fit.soft_labels and "soft_ids" in records[0]
    if fit.soft_labels and not soft:
        print("note: features hold no soft labels (train.data.soft_top_k=0 when they were made); hard labels used")

    def step(batch: list[dict], index: int):
        width = max(r["tokens"].shape[0] for r in batch)
        tokens, valid = _padded(batch, "tokens", width), _padded(batch, "valid", width)
        feats = _padded(batch, "features", width, torch.float32)
        soft_args = {}
        if soft:
            soft_args = {
                "soft_ids": _padded(batch, "soft_ids", width, torch.long),
                "soft_probs": _padded(batch, "soft_probs", width, torch.float32),
            }
        losses, accs = ttt_losses(head, embed, feats, tokens, valid, fit.ttt_steps, **soft_args)
        loss = sum(w * step_loss for w, step_loss in zip(weights, losses))
        metrics = {f"loss_{j}": float(step_loss) for j, step_loss in enumerate(losses)}
        metrics.update({f"acc_{j}": a for j, a in enumerate(accs)})
        return loss, metrics, {"acc0": f"{accs[0]:.2f}", "acc3": f"{accs[min(3, len(accs) - 1)]:.2f}"}

    fitted = fit_loop(cfg, head, "head", records, out, step, "fit (TTT)", init_from=fit.init_from)
    return {"head": head, **fitted}


def _wandb(cfg, out: Path):
    if os.environ.get("WANDB_MODE") == "disabled":
        return None
    try:
        import wandb

        return wandb.init(
            project="graft-train",
            mode=os.environ.get("WANDB_MODE", "offline"),
            dir=str(out),
            config=OmegaConf.to_container(cfg, resolve=True),
        )
    except Exception as err:  # logging must not stop training
        print(f"W&B logger unavailable ({err}); metrics go to metrics.jsonl only")
        return None


def stage_export(cfg, fitted: dict, out: Path) -> Path:
    from graft.eagle.checkpoint import save_head

    head = fitted["head"].to(getattr(torch, cfg.train.export.dtype))
    directory = save_head(head, ROOT / cfg.train.export.dir, layout="eagle")
    print(f"exported {directory} ({fitted['steps']} of {fitted['total_steps']} steps, {fitted['sequences']} sequences)")
    return directory


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> None:
    from graft.eagle.checkpoint import default_layer_ids
    from graft.models import load_model

    model_cfg = coerce_dataclass(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    hardware_cfg = coerce_dataclass(HardwareConfig, OmegaConf.to_container(cfg.hardware, resolve=True), "hardware")
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stage = cfg.train.stage
    loaded = load_model(model_cfg, hardware_cfg)
    layer_ids = list(cfg.train.head.layer_ids or default_layer_ids(loaded.target.num_layers))
    if stage in ("generate", "all"):
        plain = load_model(
            model_cfg, HardwareConfig(name="cpu_plain", fast_path="none", num_threads=hardware_cfg.num_threads)
        )
        stage_generate(cfg, plain, out)
        del plain
    if stage in ("features", "all"):
        stage_features(cfg, loaded, out, layer_ids)
    if stage in ("fit", "export", "all"):
        fitted = stage_fit(cfg, loaded, out, layer_ids)
        if stage in ("export", "all") or fitted["steps"] > 0:
            stage_export(cfg, fitted, out)


if __name__ == "__main__":
    register_schemas()
    main()
