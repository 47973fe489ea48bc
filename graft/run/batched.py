"""Batched runs (run.batch_size = B > 1): the prompts as one stream of conversations decoded B at a time, a
finished sequence handing its slot to the next, every role over a group of the stream in rotating order."""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from baselines.autoregressive import Autoregressive
from graft.backends.compiling import capacity_bucket
from graft.batch import BatchRequest, generate_batch, occupancy, rows_bucket
from graft.data.loading import Prompt
from graft.decode import Generation, SamplingConfig
from graft.drafter import Drafter
from graft.load.models import LoadedModel
from graft.registry import build_drafter
from graft.run.conversation import Conversation, PromptTooLong, next_turn, rotation
from graft.run.prompt_records import prompt_record, repeat_id
from graft.schema import ConfigError

# a batched run measures streams of at least this many times B sequences (the dataset repeated where it has
# fewer: stream_repeats), so that a batch spends most of its steps full, between its ramp-up and its drain
STREAM_FACTOR = 4


def batched_hardware(hardware, batch_size: int):
    """The hardware a batch runs on: the configured forward (the CPU engine runs ragged rows, the transformers
    forward padded ones, compiled where hardware.compile says: a graph per rows bucket), on one device (refused
    otherwise, before the model loads)."""
    if batch_size == 1:
        return hardware
    if hardware.tensor_parallel or hardware.device_map:
        raise ConfigError(
            f"run.batch_size={batch_size} decodes on one device; not with "
            f"tensor_parallel={hardware.tensor_parallel} or device_map={hardware.device_map} (run.batch_size=1 runs those)"
        )
    # padded rows are verified at one width, so a pruned tree's kept size is not read back per slot (B syncs a step)
    return dataclasses.replace(hardware, tree_bucket=0)


def stream_repeats(batch_size: int, prompts: int, repeats: int) -> int:
    """The passes over the dataset a run makes: run.repeats, raised at run.batch_size = B > 1 until the stream holds
    at least STREAM_FACTOR x B sequences (a small dataset repeated, each repeat its own record)."""
    if batch_size == 1 or prompts == 0:
        return repeats
    return max(repeats, -(-STREAM_FACTOR * batch_size // prompts))


def conversation_capacity(model: LoadedModel, prompts: list[Prompt], max_new_tokens: int, max_nodes: int) -> int:
    """Positions a batch slot needs for the longest conversation: every user turn (with empty answers in the chat
    template), each answer at most max_new_tokens (and a few tokens of template), and the widest tree."""
    longest = 0
    for prompt in prompts:
        messages = [
            m
            for turn in prompt.turns
            for m in ({"role": "user", "content": turn}, {"role": "assistant", "content": ""})
        ]
        longest = max(longest, len(model.chat.prompt_ids(messages[:-1])) + len(prompt.turns) * (max_new_tokens + 16))
    return min(longest, model.target.max_context) + max_nodes + 8


def run_conversations(
    model: LoadedModel,
    drafters: list[Drafter],
    prompts: list[Prompt],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    record_gaps: bool,
) -> tuple[dict, dict]:
    """Every prompt's turns decoded len(drafters) at a time (graft/batch.py), each turn with the generator
    run_conversation gives it; a conversation's next turn joins the queue when its answer is done. Returns
    ({position in `prompts`: Conversation, or PromptTooLong}, the batch's totals: tokens, wall and prefill seconds, steps,
    nodes verified and sequences per step summed over them)."""
    talks = [([], [], []) for _ in prompts]  # per prompt: messages, generations, texts
    results: dict = {}
    queue: deque[BatchRequest] = deque()

    def ask(at: int, number: int) -> None:
        try:
            ids, generator = next_turn(model, prompts[at], talks[at][0], number, max_new_tokens, seed)
        except PromptTooLong as err:
            results[at] = err
            return
        queue.append(BatchRequest(ids, generator, (at, number)))

    def answered(request: BatchRequest, gen: Generation, slot: int) -> None:
        at, number = request.tag
        messages, gens, texts = talks[at]
        text = model.chat.decode(gen.new_tokens)
        gens.append(gen)
        texts.append(text)
        messages.append({"role": "assistant", "content": text})
        if number + 1 < len(prompts[at].turns):
            ask(at, number + 1)
        else:
            results[at] = Conversation(gens, texts)

    for at in range(len(prompts)):
        ask(at, 0)
    capacity = conversation_capacity(model, prompts, max_new_tokens, max(d.max_nodes() for d in drafters))
    started = time.perf_counter()
    steps = generate_batch(
        model.target, drafters, queue, max_new_tokens, model.stop_ids, sampling, capacity, answered, record_gaps
    )
    gens = [g for _, generations, _ in talks for g in generations]
    full = occupancy(steps, len(drafters))
    steps = [step for step in steps if step["slots"]]  # a forward of newcomers' chunks alone decodes nothing
    totals = {
        "tokens": sum(len(g.new_tokens) for g in gens),
        "wall_s": time.perf_counter() - started,
        "prefill_s": sum(g.prefill_s for g in gens),
        "steps": len(steps),
        "nodes": sum(step["nodes"] for step in steps),
        "positions": sum(step["positions"] for step in steps),  # what the verify forwards computed, padding too
        "sequences": sum(len(step["slots"]) for step in steps),
        "steady_steps": full["steady_steps"],
        "steady_sequences": full["steady"] * full["steady_steps"],
    }
    return results, totals


def measure_group(
    model, slot_drafters: dict, prompts: list[Prompt], index: int, run_cfg, sampling
) -> tuple[dict, dict]:
    """Every role (the baseline and each contender, each with one drafter per slot) over the group's prompts in
    batches, the roles in rotating order -> ({role: {position: Conversation}}, {role: the batch's totals})."""
    results, totals = {}, {}
    for role, drafters in rotation(list(slot_drafters.items()), index):
        results[role], totals[role] = run_conversations(
            model, drafters, prompts, run_cfg.max_new_tokens, sampling, run_cfg.seed, record_gaps=(role == "baseline")
        )
    return results, totals


def warm_batches(model, slot_drafters: dict, groups: list[list[Prompt]], run_cfg, sampling) -> None:
    """Every role once over the first group's first prompts (each slot's drafter sets itself up lazily). Compiled
    (hardware.compile), also every rows bucket at every slot capacity the groups reach, each at the width the
    timed steps verify (fixed-size trees): one graph each, none left to compile inside a timed stream."""
    size = run_cfg.batch_size
    first = groups[0][:size]
    for drafters in slot_drafters.values():
        run_conversations(model, drafters, first, run_cfg.warmup_tokens, sampling, run_cfg.seed, False)
    target = model.target
    if target.compile_mode is None:
        return
    ids, tokens = model.chat.prompt_ids([{"role": "user", "content": first[0].turns[0]}]), run_cfg.warmup_tokens
    for drafters in slot_drafters.values():
        nodes = max(d.max_nodes() for d in drafters)
        # generate_batch buckets a compiled batch's capacity: equal buckets compile once
        capacities = {capacity_bucket(conversation_capacity(model, g, run_cfg.max_new_tokens, nodes)) for g in groups}
        for capacity in sorted(capacities):
            for rows in sorted({rows_bucket(n, size) for n in range(1, size + 1)}):
                queue = deque(BatchRequest(ids, None) for _ in range(rows))
                generate_batch(target, drafters[:rows], queue, tokens, set(), sampling, capacity, lambda *a: None)


def measure_batched(model, cfg, contenders: dict, baseline, todo: list, sampling, comparison: bool, *, warm):
    """The records of `todo` measured run.batch_size sequences at a time: groups of STREAM_FACTOR x B sequences,
    each a stream at concurrency B (finished sequences hand their slots to newcomers), every role over a group in
    rotating order, after an untimed warm-up of every role (warm_batches; counted as `warm`'s where compiled); a
    group's records are written together when it is done (one list per group)."""
    run_cfg, size = cfg.run, cfg.run.batch_size
    slot_drafters = {} if baseline is None else {"baseline": [Autoregressive(model.target) for _ in range(size)]}
    methods = {m.name: m for m in cfg.compared}
    for name, drafter in contenders.items():
        slot_drafters[name] = [drafter] + [build_drafter(methods[name], model.target, size) for _ in range(size - 1)]
        for other in slot_drafters[name][1:]:
            other.share_with(drafter)  # state the method shares across the batch (recycling's table: shared)
    group = STREAM_FACTOR * size
    if run_cfg.warmup and todo:
        groups = [[p for _, _, p in todo[start : start + group]] for start in range(0, len(todo), group)]
        warm.inside_timed(lambda: warm_batches(model, slot_drafters, groups, run_cfg, sampling))
    for start in range(0, len(todo), group):
        chunk = todo[start : start + group]
        results, totals = measure_group(
            model, slot_drafters, [p for _, _, p in chunk], start // group, run_cfg, sampling
        )
        name = f"{repeat_id(chunk[0][2].id, chunk[0][0])}+{len(chunk)}"  # the group: its first record and size
        batch = {"size": size, "group": name, "totals": totals}
        written = []
        for at, (repeat, index, prompt) in enumerate(chunk):
            own = {role: results[role][at] for role in results}
            settings = {"run_cfg": run_cfg, "sampling": sampling, "comparison": comparison}
            written.append(
                prompt_record(
                    model, prompt, contenders=contenders, baseline=baseline, index=index, repeat=repeat,
                    measured=own, batch=batch, **settings,
                )
            )  # fmt: skip
        yield written  # the group's records in one write (their totals are the group's)
