"""The one decode loop every method runs: prefill, then repeat draft -> verify -> accept -> commit.

Phases of a step: draft (the drafter proposes a tree), verify (one target forward over it), accept and
commit (the accepted path stays in the cache), extend (the drafter learns from the verification).
On CUDA a step reads one thing back to the host, the accepted path; everything else (the phase clock's
CUDA events, the per-step source counts, the top-2 gaps) stays on the device and is read once, after
the sequence (graft/clock.py).

Definitions used by every record and summary:
- a *step* is one verification forward of the target; prefill is not a step;
- the first new token comes from the prefill logits and is not attributed to any step; every step then
  commits its accepted tokens plus one bonus token, so `tau = step_tokens / steps` where
  `step_tokens = new_tokens - 1`; the autoregressive baseline has tau = 1.00 exactly;
- tokens are counted by id up to and including the first stop token, and at most `max_new_tokens`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from graft.acceptance import accept, device_generator, sample_token
from graft.backends.target import TargetBackend
from graft.clock import StepMarks
from graft.drafter import Drafter, PrefillInfo, Proposal, SequenceState, StepFeedback
from graft.fixed_size import deferred_in, resolve_deferred
from graft.ops import read_back, upload
from graft.tree import NodeSource, topology


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def accept_args(self, generators: list) -> dict:
        """graft.acceptance.accept's sampling arguments, one generator per tree."""
        return {"temperature": self.temperature, "top_p": self.top_p, "generators": generators}


@dataclass
class Generation:
    prompt_len: int
    new_tokens: list[int]
    stop_reason: str  # "stop_token" | "max_new_tokens" | "context"
    prefill_s: float
    wall_s: float  # prefill included
    accept_lengths: list[int] = field(default_factory=list)  # tokens committed per step (accepted + bonus)
    nodes: list[int] = field(default_factory=list)  # tree slots verified per step, root included
    kept_nodes: list[int] = field(default_factory=list)  # of those, the ones holding a token (not empty slots)
    draft_s: list[float] = field(default_factory=list)  # propose + update, per step
    verify_s: list[float] = field(default_factory=list)  # the target forward, per step
    other_s: list[float] = field(default_factory=list)  # mask, acceptance, cache commit, bookkeeping
    top2_gaps: list[float] = field(default_factory=list)  # target's top-2 logit gap for each new token
    top_logits: list[float] = field(default_factory=list)  # the target's top logit for each new token
    step_info: list[dict] = field(default_factory=list)  # the drafter's note on each step, where it keeps one
    # per step: [draft nodes, retrieved nodes, accepted draft nodes, accepted retrieved nodes] (root excluded)
    step_sources: list[list[int]] = field(default_factory=list)
    slot: int | None = None  # the batch slot it decoded in (graft/batch.py); None: alone

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def step_tokens(self) -> int:
        return len(self.new_tokens) - 1 if self.new_tokens else 0

    @property
    def decode_s(self) -> float:
        return self.wall_s - self.prefill_s

    @property
    def tau(self) -> float | None:
        return self.step_tokens / self.steps if self.steps else None


def top2_logits(logits: torch.Tensor, count: int) -> torch.Tensor:
    return logits.topk(2, dim=-1).values[:count]  # [count, 2], left on the device until the end


@torch.inference_mode()
def generate(
    target: TargetBackend,
    drafter: Drafter,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: set[int],
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    record_gaps: bool = False,
) -> Generation:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` with `drafter` proposing trees."""
    clock = target.phase_clock()
    start = clock.mark()
    taps = drafter.needs.taps  # the drafter's features, computed on its own forwards only
    target.reset(capacity=len(prompt_ids) + max_new_tokens + drafter.max_nodes() + 8)
    prefill = target.prefill(prompt_ids, taps, successors_k=drafter.needs.prompt_successors)
    if not sampling.greedy and not target.ops.on_host(prefill.logits):
        generator = device_generator(generator, prefill.logits.device)
    first = sample_token(prefill.logits[-1], sampling.temperature, sampling.top_p, generator, ops=target.ops)
    gen = Generation(
        prompt_len=len(prompt_ids), new_tokens=[first], stop_reason="max_new_tokens", prefill_s=0.0, wall_s=0.0
    )
    if record_gaps:
        top2 = [top2_logits(prefill.logits[-1:], 1)]
    state = SequenceState(tokens=list(prompt_ids) + [first], prompt_len=len(prompt_ids))
    drafter.reset(PrefillInfo(state=state, forward=prefill))
    prefilled = clock.mark()
    marks: list[StepMarks] = []
    done = first in stop_ids or max_new_tokens <= 1
    if first in stop_ids:
        gen.stop_reason = "stop_token"
    context_limit = target.max_context
    book = []  # per step its source counts and filled slots, left on the device until the end (record_steps)

    while not done:
        t0 = clock.mark()
        proposal = drafter.propose(state)  # draft
        tree = proposal.tree
        t1 = clock.mark()
        committed_len = target.cache_len
        room = context_limit - committed_len
        if room < 1:
            gen.stop_reason = "context"
            break
        proposal = fit_to_context(proposal, room)
        tree = proposal.tree
        topo = topology(tree.parents, committed_len, host=target.ops.on_host(tree.parents))
        t2 = clock.mark()
        forward = target.verify(tree, topo, taps)  # verify
        t3 = clock.mark()
        (acceptance,) = accept([tree], [topo], [forward.logits], **sampling.accept_args([generator]), ops=target.ops)
        target.commit(committed_len, acceptance.path, acceptance.path_index)

        done, committed = keep_committed(gen, state, acceptance, max_new_tokens, stop_ids)
        if record_gaps:
            top2.append(top2_logits(forward.logits[acceptance.index], len(committed)))
        t4 = clock.mark()
        if not done:  # extend: the drafter learns from the verification for the next step
            drafter.update(
                StepFeedback(proposal=proposal, topology=topo, forward=forward, acceptance=acceptance, state=state)
            )
        t5 = clock.mark()

        record_steps([gen], [proposal], [acceptance], [len(committed)], [book])
        marks.append(StepMarks(t0, t1, t2, t3, t4, t5, clock.mark()))

    times = clock.step_times(start, prefilled, marks, clock.mark())
    gen.prefill_s, gen.wall_s = times.prefill_s, times.wall_s
    gen.draft_s, gen.verify_s, gen.other_s = times.draft_s, times.verify_s, times.other_s
    read_kept([(gen, book, top2 if record_gaps else None)])
    return gen


def fit_to_context(proposal: Proposal, room: int) -> Proposal:
    """The proposal cut to the `room` positions left in the context (room >= 1): near the end of the context a
    step verifies what fits, down to the root alone (a plain decode step), so that every method commits the
    baseline's tokens up to max_new_tokens."""
    if proposal.tree.num_nodes <= room:
        return proposal
    return Proposal(proposal.tree.first(room), proposal.note.said(fitted_to_context=room))


def keep_committed(gen: Generation, state: SequenceState, acceptance, max_new_tokens: int, stop_ids) -> tuple:
    """The step's committed tokens appended to the sequence: the accepted path and bonus token, up to
    max_new_tokens and through the first stop token; the next root stays on the device too, for drafters that
    build trees there. (done, the tokens kept)."""
    committed = acceptance.tokens[: max_new_tokens - len(gen.new_tokens)]
    done = False
    for i, token in enumerate(committed):
        if token in stop_ids:
            committed = committed[: i + 1]
            gen.stop_reason, done = "stop_token", True
            break
    gen.new_tokens.extend(committed)
    state.tokens.extend(committed)
    state.root_id = acceptance.token_ids[-1:] if acceptance.token_ids is not None else None
    return done or len(gen.new_tokens) >= max_new_tokens, committed


def record_steps(
    gens: list[Generation], proposals: list[Proposal], acceptances: list, committed: list[int], books: list[list]
) -> None:
    """One step's records for every sequence that verified a tree in it (one at batch 1): its drafter's note, its
    accepted length and nodes; the trees' source counts and filled slots, counted in one pass over every tree's
    nodes, stay on the device: each sequence's `book` gets (the step's counts, its row) until read_kept."""
    for gen, proposal, count in zip(gens, proposals, committed):
        note = proposal.note.record()
        if note:
            gen.step_info.append(note)
        gen.accept_lengths.append(count)
        gen.nodes.append(proposal.tree.num_nodes)
    counts = _step_counts([p.tree for p in proposals], acceptances)
    for row, book in enumerate(books):
        book.append((counts, row))


def _step_counts(trees: list, acceptances: list) -> torch.Tensor:
    """[trees, 5]: each tree's draft and retrieved nodes, the same among its accepted nodes, and its filled slots
    (a fixed-size tree's tokens >= 0). A fixed-size scatter over the trees' joined nodes (bincount would sync to
    size its output); the paths are host lists, so the indices go up in one copy."""
    device, sizes = trees[0].tokens.device, [t.num_nodes for t in trees]
    starts = [0, *itertools.accumulate(sizes[:-1])]
    owner = [i for i, n in enumerate(sizes) for _ in range(n)]
    accepted = [start + node for start, a in zip(starts, acceptances) for node in a.path]
    index = upload(owner + starts + accepted, device)
    owner_of, roots, on_path = index.split([len(owner), len(starts), len(accepted)])
    tokens = torch.cat([t.tokens for t in trees])  # [all nodes]
    draft = lambda n: torch.full((n,), int(NodeSource.DRAFT), dtype=torch.int8, device=device)  # noqa: E731
    src = torch.cat([t.sources if t.sources is not None else draft(t.num_nodes) for t in trees]).long()
    src[roots] = int(NodeSource.ROOT)
    kinds = len(NodeSource)
    table = torch.zeros(len(trees), 2 * kinds + 1, dtype=torch.long, device=device)
    rows = torch.cat([owner_of, owner_of[on_path], owner_of])
    columns = torch.cat([src, src[on_path] + kinds, torch.full_like(src, 2 * kinds)])
    ones = torch.ones(len(owner) + len(accepted), dtype=torch.long, device=device)
    table.index_put_((rows, columns), torch.cat([ones, (tokens >= 0).long()]), accumulate=True)
    pair = slice(NodeSource.DRAFT, NodeSource.RETRIEVAL + 1)  # adjacent: slices, no index tensor from the host
    return torch.cat([table[:, pair], table[:, kinds:][:, pair], table[:, 2 * kinds :]], dim=1)


def read_kept(sequences: list[tuple[Generation, list, list | None]]) -> None:
    """What sequences kept on the device, read back in one copy at their end (a batched step's every leaver
    together): each one's deferred figures, source counts and filled slots (its book: record_steps' entries)
    and, with a top2 list, the top-2 logits of every new token. sequences: [(generation, book, top2 or None)]."""
    parts, layout = [], []
    for gen, book, top2 in sequences:
        found, deferred = deferred_in(gen.step_info)  # figures fixed-size trees kept on the device
        rows = _book_rows(book)  # [steps, 5]
        top = torch.cat(top2) if top2 else None  # [new tokens, 2]
        for part in (deferred, rows, top):
            parts += [part.double().flatten()] if part is not None else []
        layout.append((found, len(book), 0 if top is None else len(top)))
    if not parts:
        return
    host, at = read_back(torch.cat(parts)), 0
    for (gen, _, top2), (found, steps, tops) in zip(sequences, layout):
        resolve_deferred(found, host[at : at + len(found)])
        at += len(found)
        rows = [[int(v) for v in host[at + 5 * i : at + 5 * i + 5]] for i in range(steps)]
        gen.step_sources, gen.kept_nodes = [row[:4] for row in rows], [row[4] for row in rows]
        at += 5 * steps
        if top2 is not None:
            pairs = [host[at + 2 * i : at + 2 * i + 2] for i in range(tops)]
            gen.top2_gaps, gen.top_logits = [a - b for a, b in pairs], [a for a, _ in pairs]
            at += 2 * tops


def _book_rows(book: list) -> torch.Tensor | None:
    """[steps, 5] a sequence's rows of its steps' counts (record_steps), or None for no step."""
    if not book:
        return None
    steps = list({id(counts): counts for counts, _ in book}.values())  # a batched step's counts: one tensor
    first = dict(zip(map(id, steps), [0, *itertools.accumulate(len(c) for c in steps[:-1])]))
    rows = upload([first[id(counts)] + row for counts, row in book], steps[0].device)
    return torch.cat(steps).index_select(0, rows)
