"""A prompt measured one sequence at a time: its turns decoded as a conversation (each later turn seeing the
model's own earlier answers) by the baseline and every contender, in an order that rotates per prompt, their
static caches sized alike."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from graft.data.loading import Prompt
from graft.decode import Generation, SamplingConfig, generate
from graft.drafter import Drafter
from graft.load.models import LoadedModel

if TYPE_CHECKING:
    from graft.run.warmup import WarmUp


class PromptTooLong(Exception):
    pass


@dataclass
class Conversation:
    turns: list[Generation]
    texts: list[str]


def next_turn(model: LoadedModel, prompt: Prompt, messages: list[dict], number: int, max_new_tokens: int, seed: int):
    """Turn `number` of `prompt` after the conversation so far (`messages`, to which the user turn is added): its
    prompt ids and its sampling generator (seeded per prompt and turn, whatever runs beside it); PromptTooLong
    where the context cannot hold it and its answer."""
    messages.append({"role": "user", "content": prompt.turns[number]})
    ids = model.chat.prompt_ids(messages)
    limit = model.target.max_context - max_new_tokens
    if len(ids) > limit:
        raise PromptTooLong(
            f"turn {number + 1} has {len(ids)} prompt tokens; the model's context {model.target.max_context} "
            f"minus run.max_new_tokens {max_new_tokens} leaves {limit}"
        )
    return ids, torch.Generator().manual_seed(seed + zlib.crc32(f"{prompt.id}/{number}".encode()))


def run_conversation(
    model: LoadedModel,
    drafter: Drafter,
    prompt: Prompt,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    record_gaps: bool,
    before_turn: Callable[[list[int]], None] | None = None,
) -> Conversation:
    """All turns of one prompt; each later turn sees the model's own earlier answers. `before_turn` sees each
    turn's prompt ids before the turn is timed (the warm-up's guard)."""
    messages: list[dict] = []
    turns, texts = [], []
    for number in range(len(prompt.turns)):
        ids, generator = next_turn(model, prompt, messages, number, max_new_tokens, seed)
        if before_turn is not None:
            before_turn(ids)
        gen = generate(model.target, drafter, ids, max_new_tokens, model.stop_ids, sampling, generator, record_gaps)
        text = model.chat.decode(gen.new_tokens)
        turns.append(gen)
        texts.append(text)
        messages.append({"role": "assistant", "content": text})
    return Conversation(turns, texts)


def rotation(roles: list, index: int) -> list:
    """The order of the baseline and the methods on prompt `index`: each takes every position in turn."""
    shift = index % len(roles)
    return roles[shift:] + roles[:shift]


@contextlib.contextmanager
def sized_for_largest(target, drafter: Drafter, largest: int):
    """Static caches sized as if `drafter` proposed the run's largest trees (`largest` nodes): decode asks for
    its own max_nodes, so AR and tree drafters would land in different buckets for one turn and alternate
    cache buffers; this way every drafter of a turn shares one bucket, one buffer and one graph per tree size."""
    before = target.spare_nodes
    target.spare_nodes = largest - drafter.max_nodes()
    try:
        yield
    finally:
        target.spare_nodes = before


def measure_prompt(
    model, contenders: dict, baseline, prompt, index: int, run_cfg, sampling, warm: WarmUp | None = None
) -> dict:
    """Every contender and the baseline on one prompt, in rotating order -> {role: Conversation}."""
    roles = ([("baseline", baseline)] if baseline is not None else []) + list(contenders.items())
    largest = max(drafter.max_nodes() for _, drafter in roles)
    guard = warm.before_turn if warm is not None else None
    results = {}
    for role, drafter in rotation(roles, index):
        with sized_for_largest(model.target, drafter, largest):
            results[role] = run_conversation(
                model,
                drafter,
                prompt,
                run_cfg.max_new_tokens,
                sampling,
                run_cfg.seed,
                record_gaps=(role == "baseline"),
                before_turn=guard,
            )
    return results
