"""One benchmark run: load the target, build the drafters of the compared methods (one, or a comparison's
several) and the autoregressive baseline, then for each prompt run them all in an order that rotates per
prompt, after an untimed warm-up of each; check losslessness against the baseline and write the record.
`method=ar` runs the baseline alone."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from graft.backends.target import buckets_between, capacity_bucket, compile_counts, uses_cudagraphs
from graft.config.experiment import ExperimentConfig
from graft.schema import ConfigError
from graft.batch import BatchRequest, generate_batch, occupancy
from graft.data.loading import BUILT_WITH_TOKENIZER, Prompt, load_prompts
from graft.data.scoring import score as score_answer
from graft.decode import Generation, SamplingConfig, generate
from graft.run.lossless import compare
from baselines.autoregressive import Autoregressive
from graft.drafter import Drafter
from graft.run.tracking import logged_config, make_logger, run_tags, sweep_group, task_overrides
from graft.plan.hardware import check_memory, resolve_hardware
from graft.records.metrics import batch_summary, side_totals, summarize
from graft.load.models import LoadedModel, load_model
from graft.analysis.plots import plot_comparison_pareto
from graft.run.provenance import collect as collect_provenance
from graft.run.provenance import commit_hash_of, resumed_update
from graft.records.writer import RunDir, completed_summary, hardware_info, peak_memory, records_digest, token_hash
from graft.registry import build_drafter
from graft.load.resolve import resolve as resolve_artefacts
from graft.analysis.stats import INTERVAL_METHOD, METRICS, intervals
from graft.tree import DraftTree, NodeSource, topology

log = logging.getLogger(__name__)
# a batched run measures streams of at least this many times B sequences (the dataset repeated where it has
# fewer: stream_repeats), so that a batch spends most of its steps full, between its ramp-up and its drain
STREAM_FACTOR = 4


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


def turn_record(gen: Generation, text: str) -> dict:
    ms = lambda values: [round(v * 1e3, 3) for v in values]  # noqa: E731
    return {
        "prompt_tokens": gen.prompt_len,
        "new_tokens": len(gen.new_tokens),
        "step_tokens": gen.step_tokens,
        "steps": gen.steps,
        "tau": gen.tau,
        "stop_reason": gen.stop_reason,
        "prefill_s": gen.prefill_s,
        "ttft_s": gen.prefill_s,
        "decode_s": gen.decode_s,
        "wall_s": gen.wall_s,
        "accept_lengths": gen.accept_lengths,
        "nodes": gen.nodes,
        "kept_nodes": gen.kept_nodes,
        "draft_ms": ms(gen.draft_s),
        "verify_ms": ms(gen.verify_s),
        "other_ms": ms(gen.other_s),
        "step_info": gen.step_info,
        "step_sources": gen.step_sources,
        "tokens_sha256": token_hash(gen.new_tokens),
        "text": text,
        **({"slot": gen.slot} if gen.slot is not None else {}),
    }


def side_record(conv: Conversation) -> dict:
    turns = [turn_record(g, t) for g, t in zip(conv.turns, conv.texts)]
    return {"turns": turns, "totals": side_totals(turns)}


def rotation(roles: list, index: int) -> list:
    """The order of the baseline and the methods on prompt `index`: each takes every position in turn."""
    shift = index % len(roles)
    return roles[shift:] + roles[:shift]


def method_view(record: dict, name: str) -> dict:
    """A comparison record seen as a single-method record for method `name` (what summarize() reads)."""
    if record.get("status") != "ok":
        return record
    entry = record["methods"][name]
    view = {k: v for k, v in record.items() if k not in ("methods", "score")}
    view.update(method=entry["side"], lossless=entry["lossless"], speedup_wall=entry["speedup_wall"])
    if record.get("score"):
        view["score"] = {"method": record["score"][name], "baseline": record["score"].get("baseline")}
    return view


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


def batched_hardware(hardware, batch_size: int):
    """The hardware a batch runs on: the configured forward (the CPU engine runs ragged rows, the transformers
    forward padded ones), eager and on one device (refused otherwise, before the model loads)."""
    if batch_size == 1:
        return hardware
    if hardware.compile != "off" or hardware.tensor_parallel or hardware.device_map:
        raise ConfigError(
            f"run.batch_size={batch_size} decodes on one device, eager; not with hardware.compile={hardware.compile}, "
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


def outcome(
    conv: Conversation, base: Conversation | None, base_side: dict | None, greedy: bool, model, ulps: int | None
):
    """(side record, lossless verdict, wall speedup) of one method's conversation against the baseline's."""
    side = side_record(conv)
    if base is None or not greedy:
        lossless = {"checked": False, "equal": None, "first_divergence": None}
    else:
        lossless = compare(conv, base, model.target.dtype, ulps)
    b_tps = (base_side or side)["totals"]["tokens_per_s"]
    return side, lossless, side["totals"]["tokens_per_s"] / b_tps if b_tps else None


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


def turn_spans(model: LoadedModel, prompt: Prompt, max_new_tokens: int) -> list[tuple[int, int]]:
    """(fewest, most) prompt tokens of each turn of `prompt`, before its earlier answers are known.

    Why that is enough: turn k's prompt is the chat of turns 1..k and the k - 1 answers between them, each
    answer at most `max_new_tokens` generated tokens; so the chat has its fewest tokens with the answers
    empty and its most with each answer `max_new_tokens` long, as long as an answer, decoded and tokenized
    again, takes no more tokens than were generated. That is true of text a tokenizer would write, not a
    theorem (the tiny models' byte tokenizer turns an invalid byte into U+FFFD, three bytes), so
    WarmUp.before_turn also checks each turn's exact length before it is timed: a bucket missed here is
    warmed there, untimed, and named in run.json (`late_buckets`)."""
    messages, spans = [], []
    for number, user_turn in enumerate(prompt.turns):
        messages.append({"role": "user", "content": user_turn})
        fewest = len(model.chat.prompt_ids(messages))
        spans.append((fewest, fewest + number * max_new_tokens))
        messages.append({"role": "assistant", "content": ""})
    return spans


def tree_sizes(drafter: Drafter) -> list[int]:
    """The tree sizes `drafter` verifies when it cuts fixed-size trees to a multiple of a bucket (pruning:
    graft/compose.py, ComposedDrafter._bucketed), which step depends on the data; [] when every tree has one size."""
    bucket, top = getattr(drafter, "bucket", 0), drafter.max_nodes()
    return sorted({*range(bucket, top, bucket), top}) if bucket else []


def verify_sizes(target, drafter: Drafter, prompt: list[int], new_tokens: int) -> None:
    """One verify forward per tree size `drafter` may verify (tree_sizes), each rolled back: a few warm-up
    steps meet only some of the sizes, and every size over every cache bucket is a graph of its own."""
    sizes = tree_sizes(drafter)
    if not sizes:
        return
    taps = drafter.needs.taps  # hidden-state hooks are part of the compiled graph
    target.reset(len(prompt) + new_tokens + drafter.max_nodes() + 8)  # as decode sizes the cache
    target.prefill(prompt, taps)
    committed = target.cache_len
    for size in sizes:
        tree = DraftTree.chain(prompt[-1], (prompt * size)[: size - 1], NodeSource.DRAFT, target.device)
        target.verify(tree, topology(tree.parents, committed, host=target.ops.on_host(tree.parents)), taps)
        target.cache.keep(committed, None, 0)


@dataclass
class WarmUp:
    """Untimed runs of every drafter before the timed ones. Compiled (hardware.compile), one per static cache
    bucket a turn can reach, every drafter sized for the largest (sized_for_largest), so that no graph compiles
    inside a timed run; `before_turn` warms a bucket the spans missed just before the turn that needs it."""

    model: LoadedModel
    drafters: list[Drafter]
    run_cfg: object
    sampling: SamplingConfig
    warmed: set[int] = field(default_factory=set)  # buckets every drafter has run in
    late: list[int] = field(default_factory=list)  # buckets first met by a turn about to be timed
    counts: dict[str, int] = field(default_factory=dict)  # compile_counts() spent warming up
    late_counts: dict[str, int] = field(default_factory=dict)  # the part of it spent inside the timed loop
    filler: list[int] = field(default_factory=list)  # the warm-up prompts' tokens: the first prompt's

    @property
    def largest(self) -> int:
        return max(drafter.max_nodes() for drafter in self.drafters)

    @property
    def compiled(self) -> bool:
        return self.model.target.compile_mode is not None

    def bucket(self, prompt_len: int) -> int:
        return capacity_bucket(prompt_len + self.run_cfg.max_new_tokens + self.largest + 8)  # as decode asks

    def start(self, prompts: list[Prompt]) -> None:
        """Eager: each drafter once, on the first prompt. Compiled: each drafter in every bucket the turns
        of `prompts` can reach (turn_spans), a turn being refused past the model's context."""
        target, max_new = self.model.target, self.run_cfg.max_new_tokens
        self.filler = self.model.chat.prompt_ids([{"role": "user", "content": prompts[0].turns[0]}])
        if not self.compiled:
            return self._run_all(self.filler[-target.max_context // 2 :])
        longest = target.max_context - max_new  # run_conversation refuses longer turns
        needed = set()
        for prompt in prompts:
            for fewest, most in turn_spans(self.model, prompt, max_new):
                if fewest <= longest:
                    needed.update(buckets_between(self.bucket(fewest), self.bucket(min(most, longest))))
        for bucket in sorted(needed):
            self.cover(bucket)

    def before_turn(self, ids: list[int]) -> None:
        """Warm the bucket of a turn about to be timed if the spans missed it (run.json: late_buckets)."""
        if self.compiled and len(ids) <= self.model.target.max_context - self.run_cfg.max_new_tokens:
            bucket = self.bucket(len(ids))
            if bucket not in self.warmed:
                self.late.append(bucket)
                self.cover(bucket, late=True)

    def cover(self, bucket: int, late: bool = False) -> None:
        """Every drafter once in `bucket`, on a prompt that fills it; within the context, which still lands
        there whenever a real turn can (a turn has len + max_new_tokens <= the context)."""
        tokens, context = self._tokens(), self.model.target.max_context
        length = min(bucket - tokens - self.largest - 8, context - tokens)
        ids = self.filler or self.model.chat.prompt_ids([{"role": "user", "content": "Hello."}])
        self._run_all((ids * (length // len(ids) + 1))[:length], late)
        self.warmed.add(bucket)

    def _tokens(self) -> int:
        # a real turn in a bucket has at least one prompt token and max_new_tokens of room: so does the warm-up
        return min(self.run_cfg.warmup_tokens, self.run_cfg.max_new_tokens)

    def _run_all(self, prompt: list[int], late: bool = False) -> None:
        before = compile_counts()
        target = self.model.target
        for drafter in self.drafters:
            with sized_for_largest(target, drafter, self.largest):
                generator = torch.Generator().manual_seed(0)
                # no stop tokens: a warm-up that stopped at its first token would verify nothing, compile nothing
                generate(target, drafter, prompt, self._tokens(), set(), self.sampling, generator)
                if self.compiled:
                    verify_sizes(target, drafter, prompt, self._tokens())
        for key, value in compile_counts().items():
            for counts in (self.counts, self.late_counts) if late else (self.counts,):
                counts[key] = counts.get(key, 0) + value - before[key]

    def record(self, timed: dict[str, int]) -> dict:
        """run.json's `compile`: what compiled at warm-up and inside timed runs (`timed`: compile_counts()
        over the timed loop, the late warm-ups in it included, which are taken out here)."""
        target = self.model.target
        warm, late = self.counts, self.late_counts
        timed = {key: value - late.get(key, 0) for key, value in timed.items()}
        info = {
            "cache_buckets": sorted(self.warmed),
            "late_buckets": self.late,
            "graphs_at_warmup": warm.get("graphs", 0),
            "graphs_timed": timed["graphs"],
        }
        if uses_cudagraphs(target):
            info["cudagraphs"] = "recorded"
            info["cudagraph_records_at_warmup"] = warm.get("cudagraph_records", 0)
            info["cudagraph_records_timed"] = timed["cudagraph_records"]  # each one a re-record or a late first
            info["cudagraph_skips"] = warm.get("cudagraph_skips", 0) + timed["cudagraph_skips"]
        else:  # counted as zero, they would read as "no re-records" where nothing was recorded at all
            info["cudagraphs"] = (
                f"none: hardware.compile={target.compile_mode}, compile_backend={target.compile_backend} "
                f"on {target.device.type} records no CUDA graphs"
            )
            info["cudagraph_records_at_warmup"] = info["cudagraph_records_timed"] = None
        return info


def run(cfg: ExperimentConfig, resolved: dict, experiment: str | None = None) -> dict:
    """A single-method run (today's records: `method`, `baseline` per prompt) or a comparison
    (`methods=[...]`: every method and ONE baseline per prompt; one summary per method and a comparison
    summary)."""
    run_cfg = cfg.run
    sampling = SamplingConfig(temperature=run_cfg.temperature, top_p=run_cfg.top_p)
    plan = {"num_prompts": run_cfg.num_prompts, "dataset_num_prompts": cfg.dataset.num_prompts}
    if run_cfg.repeats > 1:  # (run.repeats=1 keeps the plan, and so the completeness, of runs before repeats)
        plan["repeats"] = run_cfg.repeats
    done = completed_summary(run_cfg.out_dir, resolved, plan)
    if done is not None:
        log.info("%s: already complete for this config; nothing to run", run_cfg.out_dir)
        return done
    if cfg.dataset.source not in BUILT_WITH_TOKENIZER:
        load_prompts(cfg.dataset, cfg.paths.data_root)  # bad dataset input fails before the model loads
    cfg, choice = resolve_hardware(cfg)  # hardware=auto: CUDA (as many GPUs as the plan needs) or the CPU
    log.info(choice.line)
    check_memory(cfg)  # a model this machine cannot hold is refused here, in seconds, with the figures
    artefacts = resolve_artefacts(cfg)  # every missing file named at once, heads fetched, before the target loads
    rundir = RunDir(run_cfg.out_dir, resolved)  # writable, no other config's results, ours alone: before loading
    try:
        return _run_in(rundir, cfg, resolved, experiment, choice, artefacts, plan, sampling)
    finally:
        rundir.close()  # the folder's lock let go of, however the run ended


def _run_in(rundir: RunDir, cfg, resolved: dict, experiment, choice, artefacts, plan: dict, sampling) -> dict:
    """The run proper, in its locked folder: load the model, measure every prompt not yet recorded, summarise."""
    run_cfg = cfg.run
    hardware_cfg = batched_hardware(cfg.hardware, run_cfg.batch_size)
    model = load_model(cfg.model, hardware_cfg, progress=run_cfg.progress)
    prompts = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)
    if run_cfg.num_prompts:
        if run_cfg.num_prompts > len(prompts):
            log.warning(
                "run.num_prompts=%d, but %s has %d: running %d",
                run_cfg.num_prompts,
                cfg.dataset.name,
                len(prompts),
                len(prompts),
            )
        prompts = prompts[: run_cfg.num_prompts]
    hardware = hardware_info(str(model.target.device), model.target.attention)
    hardware["choice"] = choice.record()  # what hardware=auto settled on, and why
    hardware["timing"] = model.target.timing
    hardware["compile"] = model.target.compile_mode or "off"
    if model.target.kernels:
        hardware["kernels"] = model.target.kernels
    comparison = cfg.methods is not None
    label = "compare" if comparison else cfg.method.name
    meta = {
        "model": cfg.model.name,
        "method": cfg.method.name,
        "dataset": cfg.dataset.name,
        "hardware": hardware,
        "model_source": model.source,
        "max_new_tokens": run_cfg.max_new_tokens,
        "temperature": run_cfg.temperature,
    }
    # at run.batch_size=B a cost-aware method measures its costs at B (graft/methods/auto_budget.py)
    contenders = {m.name: build_drafter(m, model.target, run_cfg.batch_size) for m in cfg.compared}
    provenance = collect_provenance(cfg, model.source, commit_hash_of(model.target))  # one `git status`
    rundir.start({"hardware": hardware, "artefacts": artefacts, "provenance": provenance})
    resumed = resumed_update(json.loads(rundir.run_path.read_text()), provenance)
    if resumed is not None:  # a resumed folder: the first run's provenance stays, a different one is added
        rundir.update_run(resumed)
    only_ar = not comparison and isinstance(contenders[cfg.method.name], Autoregressive)
    baseline = None if only_ar else Autoregressive(model.target)

    # the summary describes this command's prompts: records of a larger earlier selection stay in
    # samples.jsonl but are not counted (a rerun with fewer prompts reports those only)
    # repeat k (run.repeats) of every prompt after repeat k - 1 of all of them, each its own record (repeat_id)
    repeats = stream_repeats(run_cfg.batch_size, len(prompts), run_cfg.repeats)
    if repeats > run_cfg.repeats:
        log.info(
            "run.batch_size=%d: %d prompts repeated %d times, a stream of at least %d x B sequences",
            run_cfg.batch_size, len(prompts), repeats, STREAM_FACTOR,
        )  # fmt: skip
    passes = [(k, i, p) for k in range(1, repeats + 1) for i, p in enumerate(prompts)]
    selected = {repeat_id(p.id, k) for k, _, p in passes}
    earlier = rundir.finished()
    records = [r for r in earlier if r["id"] in selected]
    if len(records) < len(earlier):
        log.info(
            "%d records in %s are outside this selection; not summarised", len(earlier) - len(records), run_cfg.out_dir
        )
    finished_ids = {r["id"] for r in records}
    todo = [(k, i, p) for k, i, p in passes if repeat_id(p.id, k) not in finished_ids]
    configs = {m.name: m.flat() for m in cfg.compared}  # every key of each method, defaults resolved
    for name, drafter in contenders.items():  # what a checkpoint decided: the block size actually used
        used = getattr(getattr(drafter, "source", None), "block_size", None)
        if "block_size" in configs[name] and used is not None:
            configs[name]["block_size"] = used
        profiled = cost_profile_batch(drafter)
        if profiled is not None and (profiled > 1 or run_cfg.batch_size > 1):  # batch 1 records what it did
            configs[name]["cost_profile_batch"] = profiled  # the batch size its cost profile was measured at

    def summaries() -> dict:
        if not comparison:
            return summarize(records, {**meta, "method_config": configs[cfg.method.name]})
        per_method = {
            name: summarize(
                [method_view(r, name) for r in records], {**meta, "method": name, "method_config": configs[name]}
            )
            for name in contenders
        }
        return comparison_summary(per_method, meta)

    summary, figures, failed = summaries(), [], True
    logger = make_logger(
        cfg.logger,
        resolved,
        run_cfg.out_dir,
        job_type=label,
        group=sweep_group() or experiment or label,
        overrides=task_overrides(),
        config=logged_config(resolved, configs, provenance, comparison),
        tags=run_tags(cfg.model.name, cfg.dataset.name, hardware),
    )
    try:
        drafters = [d for d in (baseline, *contenders.values()) if d is not None]
        warm = WarmUp(model, drafters, run_cfg, sampling)
        if todo and run_cfg.warmup:
            warm.start(list({p.id: p for _, _, p in todo}.values()))  # each prompt once, however many repeats
        counts = compile_counts()
        bar = tqdm(total=len(todo), desc=f"{label} on {cfg.dataset.name}", unit="prompt", disable=not run_cfg.progress)
        measured = (
            measure_batched(model, cfg, contenders, baseline, todo, sampling, comparison)
            if run_cfg.batch_size > 1
            else (
                prompt_record(
                    model,
                    contenders,
                    baseline,
                    prompt,
                    index,
                    run_cfg,
                    sampling,
                    comparison,
                    warm if run_cfg.warmup else None,
                    repeat=repeat,
                )
                for repeat, index, prompt in todo
            )
        )
        with logging_redirect_tqdm(tqdm_class=tqdm):  # a line logged mid-run is written above the bar
            for written in measured:  # a record, or a batched group's records (written in one go)
                written = written if isinstance(written, list) else [written]
                rundir.append_all(written)
                records.extend(written)
                summary = summaries()
                rundir.write_summary(summary)
                for record in written:
                    if comparison:
                        for name in contenders:
                            logger.log_sample(method_view(record, name), summary["methods"][name], prefix=f"{name}/")
                    else:
                        logger.log_sample(record, summary)
                bar.update(len(written))
                bar.set_postfix(done=len(records))
        bar.close()
        summary["peak_memory"] = peak_memory(model.target.devices)
        if model.target.compile_mode is not None:  # a graph compiled after the warm-up was timed: say so
            compile_info = warm.record({key: value - counts[key] for key, value in compile_counts().items()})
            summary["compile"] = compile_info
            rundir.update_run({"compile": compile_info})
        # every prompt of this plan is recorded: a rerun skips the job while samples.jsonl still holds these
        ids = [repeat_id(p.id, k) for k, _, p in passes]
        by_id = {r["id"]: r for r in records}
        summary["complete"] = {"plan": plan, "ids": ids, "records_sha1": records_digest([by_id[i] for i in ids])}
        # 95% intervals over these prompts, overall and per category, keyed by method name (graft/analysis/stats.py)
        named = records if comparison else [{**r, "_method": cfg.method.name} for r in records]
        summary["intervals"] = intervals(named)
        summary["interval_method"] = INTERVAL_METHOD
        if run_cfg.batch_size > 1:  # throughput over the whole batch, per-sequence latency, nodes per batched step
            summary["batch"] = {**batch_summary(records, run_cfg.batch_size), "stream_repeats": repeats}
        if repeats > 1:  # each headline ratio per repeat: the machine's noise between runs
            add_repeats(summary, records, repeats, list(contenders) if comparison else None)
        rundir.write_summary(summary)
        if comparison:
            for name, method_summary in summary["methods"].items():
                rundir.write_json(f"summaries/{name}.json", method_summary)
            if summary["n_prompts"]:
                figures.append(plot_comparison_pareto(summary, rundir.path / "pareto.png"))
        failed = False
        return summary
    finally:
        logger.finish(summary, records, figures, failed=failed)


def measure_batched(model, cfg, contenders: dict, baseline, todo: list, sampling, comparison: bool):
    """The records of `todo` measured run.batch_size sequences at a time: groups of STREAM_FACTOR x B sequences,
    each a stream at concurrency B (finished sequences hand their slots to newcomers), every role over a group in
    rotating order, after an untimed warm-up of every role on the first prompts; a group's records are written
    together when it is done (one list per group)."""
    run_cfg, size = cfg.run, cfg.run.batch_size
    slot_drafters = {} if baseline is None else {"baseline": [Autoregressive(model.target) for _ in range(size)]}
    methods = {m.name: m for m in cfg.compared}
    for name, drafter in contenders.items():
        slot_drafters[name] = [drafter] + [build_drafter(methods[name], model.target, size) for _ in range(size - 1)]
        for other in slot_drafters[name][1:]:
            other.share_with(drafter)  # state the method shares across the batch (recycling's table: shared)
    if run_cfg.warmup and todo:
        first = [prompt for _, _, prompt in todo[:size]]
        for drafters in slot_drafters.values():
            run_conversations(model, drafters, first, run_cfg.warmup_tokens, sampling, run_cfg.seed, False)
    group = STREAM_FACTOR * size
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
            written.append(
                prompt_record(
                    model,
                    contenders,
                    baseline,
                    prompt,
                    index,
                    run_cfg,
                    sampling,
                    comparison,
                    repeat=repeat,
                    measured=own,
                    batch=batch,
                )
            )
        yield written  # the group's records in one write (their totals are the group's)


def cost_profile_batch(drafter) -> int | None:
    """The batch size the cost profile of a cost-aware drafter (its split or trim auto) was measured at; None
    for a drafter that reads no profile."""
    parts = (getattr(drafter, "split", None), getattr(drafter, "trim", None))
    profiles = [part.profile for part in parts if getattr(part, "profile", None) is not None]
    return profiles[0].batch if profiles else None


def repeat_id(prompt_id: str, repeat: int) -> str:
    """The record id of a prompt's `repeat`-th measurement (run.repeats): the prompt's id for the first, so
    run.repeats=1 writes the records it always did, and "<id>#<repeat>" for the later ones."""
    return prompt_id if repeat == 1 else f"{prompt_id}#{repeat}"


def add_repeats(summary: dict, records: list[dict], repeats: int, methods: list[str] | None) -> None:
    """summary.json's `repeats`: each headline ratio (stats.METRICS) summarised per repeat, and its mean, min,
    max and values over the repeats; a comparison's per method (under `methods` and in each method's summary)."""
    passes = [[r for r in records if r.get("repeat", 1) == k] for k in range(1, repeats + 1)]
    names = methods if methods is not None else [None]
    found = {}
    for name in names:
        per_repeat = [summarize([method_view(r, name) for r in group] if name else group, {}) for group in passes]
        found[name] = {"R": repeats, **{m: repeat_spread([s.get(m) for s in per_repeat]) for m in METRICS}}
    if methods is None:
        summary["repeats"] = found[None]
        return
    for name in methods:
        summary["methods"][name]["repeats"] = found[name]
    summary["repeats"] = {"R": repeats, "methods": {name: {m: found[name][m] for m in METRICS} for name in methods}}


def repeat_spread(values: list) -> dict:
    """{"mean", "min", "max", "values"} of one ratio over the repeats (None where a repeat has no value)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"mean": None, "min": None, "max": None, "values": values}
    return {"mean": sum(known) / len(known), "min": min(known), "max": max(known), "values": values}


def prompt_record(
    model,
    contenders: dict,
    baseline,
    prompt,
    index: int,
    run_cfg,
    sampling,
    comparison: bool,
    warm=None,
    repeat: int = 1,
    measured: dict | None = None,
    batch: dict | None = None,
) -> dict:
    """One prompt measured for every contender and the baseline, as the line samples.jsonl keeps; a later
    `repeat` (run.repeats) is its own record (repeat_id), naming its prompt, in an order rotated one further.
    `measured`: the prompt's {role: Conversation or PromptTooLong} of a batched group (measure_group), and
    `batch` what the record says of that group."""
    record = {
        "id": repeat_id(prompt.id, repeat),
        "category": prompt.category,
        "index": index,
        "turns": len(prompt.turns),
    }
    if repeat > 1:
        record.update(prompt_id=prompt.id, repeat=repeat)
    if batch is not None:
        record["batch"] = batch
    try:
        order = index + repeat - 1  # each repeat puts every method at another place in the rotation
        if measured is None:
            results = measure_prompt(model, contenders, baseline, prompt, order, run_cfg, sampling, warm)
        else:
            for result in measured.values():
                if isinstance(result, PromptTooLong):
                    raise result
            results = measured
    except PromptTooLong as err:
        log.warning("skipped prompt %s: %s", prompt.id, err)
        return {**record, "status": "skipped", "reason": str(err)}
    base = results.get("baseline")
    base_side = side_record(base) if base is not None else None
    verdicts = {
        name: outcome(results[name], base, base_side, sampling.greedy, model, run_cfg.float_tie_ulps)
        for name in contenders
    }
    record.update(status="ok", baseline=base_side)
    if comparison:
        record["methods"] = {
            name: {"side": side, "lossless": lossless, "speedup_wall": speedup}
            for name, (side, lossless, speedup) in verdicts.items()
        }
    else:
        (name,) = contenders
        side, lossless, speedup = verdicts[name]
        record.update(method=side, lossless=lossless, speedup_wall=speedup)
    if run_cfg.score:
        scored = {role: score_answer(prompt, conv.texts) for role, conv in results.items()}
        record["score"] = scored if comparison else {"method": scored[name], "baseline": scored.get("baseline")}
    return record


COMPARISON_KEYS = (
    "tau",
    "speedup_wall",
    "speedup_decode",
    "avg_nodes_per_step",
    "tokens_per_s",
    "lossless",
    "retrieval_share",
    "ms_per_step",
    "n_prompts",
)


def comparison_summary(per_method: dict[str, dict], meta: dict) -> dict:
    """One row per method (the baseline first) of the headline metrics, plus every method's full summary."""
    first = next(iter(per_method.values()))
    baseline_row = {
        "tau": first["baseline_tau"],
        "speedup_wall": 1.0 if first["baseline_tokens_per_s"] else None,
        "speedup_decode": 1.0 if first["baseline_tokens_per_s"] else None,
        "avg_nodes_per_step": 1.0 if first["n_prompts"] else None,
        "tokens_per_s": first["baseline_tokens_per_s"],
        "lossless": None,
        "retrieval_share": None,
        "ms_per_step": first["baseline_ms_per_step"],
        "n_prompts": first["n_prompts"],
    }
    rows = {"ar": baseline_row, **{name: {k: s.get(k) for k in COMPARISON_KEYS} for name, s in per_method.items()}}
    return {
        **{k: v for k, v in meta.items() if k != "method"},
        "kind": "comparison",
        "method": "compare",
        "baseline": "ar",
        "n_prompts": first["n_prompts"],
        "n_skipped": first["n_skipped"],
        "rows": rows,
        "methods": per_method,
        "definitions": first["definitions"],
    }
