"""The untimed warm-up before the timed runs: every drafter once, or, compiled, once in every static cache bucket a
turn of the run's prompts can reach and at every tree size it may verify, so that no graph compiles inside a timed
run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from graft.backends.compiling import buckets_between, capacity_bucket, compile_counts, uses_cudagraphs
from graft.data.loading import Prompt
from graft.decode import SamplingConfig, generate
from graft.drafter import Drafter
from graft.load.models import LoadedModel
from graft.run.conversation import sized_for_largest
from graft.tree import DraftTree, NodeSource, topology


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
        self._count(before, late)

    def inside_timed(self, warm: Callable[[], None]) -> None:
        """A warm-up run inside the timed window (a batched run's: graft/run/batched.py, warm_batches): what it
        compiles is counted as warm-up, not as timed."""
        before = compile_counts()
        warm()
        self._count(before, late=True)

    def _count(self, before: dict[str, int], late: bool) -> None:
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
