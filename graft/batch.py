"""Batched speculative decoding: up to B sequences decode together, one target forward verifying every live
sequence's tree per step, with continuous batching (a sequence that stops leaves its slot and the next request
takes it, so the batch stays full until the requests run out).

Per step: the live slots draft in lockstep (Drafter.propose_steps: each round every slot's pending model call runs
as one, e.g. one EAGLE head forward over every slot's frontier); one forward verifies every tree; one call decides
every tree's acceptance (graft/acceptance.py: accept, the batch-1 loop's entry point too); per slot the commit into
the slot's own cache (graft/backends/slots.py) and the stop checks; the drafters' updates (extend) in lockstep
(Drafter.update_steps: one head forward for every slot's accepted tokens); the step's records in one pass
(record_steps). Each sequence keeps its own cache length, positions and drafter state, so its tokens are what
batch-1 decoding gives, up to the float ties a batched product may move (graft/run/lossless.py).

Two forwards verify a batch. On a ragged backend (the CPU engine: TargetBackend.ragged_rows) each tree is a
segment of one forward (forward_segments): only real nodes are computed, each over its own slot's prefix, and the
newcomers' prompt chunks ride in the same forward, at most one chunk's worth of positions (hardware.prefill_chunk)
a step. Otherwise (the transformers forward) the trees are padded rows (verify_rows) and newcomers' chunks run
between two steps, at most one chunk's worth while sequences decode. On a GPU (fixed-size trees, device
acceptance) a step reads the host once for the whole batch and its padded forward has a fixed shape per bucket of
live slots (`rows_bucket`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from graft.acceptance import accept, device_generator, sample_token
from graft.backends.compiling import capacity_bucket
from graft.backends.slots import SlotCaches
from graft.backends.target import PromptPrefill, Segment, TargetBackend, tree_segment, tree_segments
from graft.decode import (
    Generation,
    SamplingConfig,
    fit_to_context,
    keep_committed,
    read_kept,
    record_steps,
    top2_logits,
)
from graft.drafter import Drafter, PrefillInfo, SequenceState, StepFeedback, run_calls
from graft.tree import DraftTree, TreeRows, topology, tree_rows


@dataclass
class BatchRequest:
    """One sequence to decode: its prompt ids, its sampling generator, and the caller's key (`tag`)."""

    prompt_ids: list[int]
    generator: torch.Generator | None = None
    tag: Any = None


@dataclass
class _Live:
    request: BatchRequest
    admitted: float
    prefill: PromptPrefill | None = None  # the prompt's chunks still to encode (None once it decodes)
    prefill_s: float = 0.0  # the seconds of its own chunks (waiting for the others' steps is not prefill)
    generator: torch.Generator | None = None  # the sampling draws' (on the target's device for device acceptance)
    state: SequenceState | None = None
    gen: Generation | None = None
    top2: list = field(default_factory=list)
    book: list = field(default_factory=list)  # per step its source counts, left on the device (record_steps)


def slot_capacity(prompt_lens: list[int], max_new_tokens: int, max_nodes: int) -> int:
    """Positions a slot needs: the longest prompt, its answer and the widest tree of a step (padding included)."""
    return max(prompt_lens) + max_new_tokens + max_nodes + 8


def rows_bucket(count: int, slots: int) -> int:
    """The rows a fixed-shape forward verifies for `count` slots: the next power of two, at most `slots`."""
    return min(slots, 1 << max(count - 1, 0).bit_length())


def occupancy(steps: list[dict], size: int) -> dict:
    """How full a batch of `size` slots was over generate_batch's `steps`: mean sequences per decoding step over
    the whole stream, and in its steady part (from the first full step to the last step with requests still
    queued: the ramp-up and the drain left out; the whole stream where it never filled)."""
    decoding = [len(step["slots"]) for step in steps if step["slots"]]
    if not decoding:
        return {"mean": 0.0, "steady": 0.0, "steady_steps": 0}
    queued = [step.get("queued", 0) for step in steps if step["slots"]]
    full = next((i for i, n in enumerate(decoding) if n == size), None)
    last = max((i for i, q in enumerate(queued) if q > 0), default=None)
    steady = decoding[full : last + 1] if full is not None and last is not None and last >= full else decoding
    return {
        "mean": sum(decoding) / len(decoding),
        "steady": sum(steady) / len(steady),
        "steady_steps": len(steady),
    }


@torch.inference_mode()
def generate_batch(
    target: TargetBackend,
    drafters: list[Drafter],
    requests: deque[BatchRequest],
    max_new_tokens: int,
    stop_ids: set[int],
    sampling: SamplingConfig,
    capacity: int,
    on_done: Callable[[BatchRequest, Generation, int], None],
    record_gaps: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> list[dict]:
    """Decode every request of `requests` (a queue `on_done` may append to: a conversation's next turn) with one
    drafter per slot (len(drafters) = B), calling on_done(request, generation, slot) as each finishes. Returns
    one entry per step: the live slots and the nodes verified (the batch's own record).

    Newcomers' prompts are encoded between two batched steps, the oldest first, at most one chunk's worth of
    positions (hardware.prefill_chunk) in all while sequences decode, so a newcomer stalls the others one chunk
    at a time (and short prompts share a gap); while no sequence decodes, the chunks run back to back."""
    if target.compile_mode is not None:  # the capacity is the mask's width: one graph serves every stream in a bucket
        capacity = capacity_bucket(capacity)
    slots = SlotCaches(target, len(drafters), capacity, ops=target.ops)
    free, live, filling, steps = deque(range(len(drafters))), {}, {}, []
    run = _Run(target, drafters, slots, max_new_tokens, stop_ids, sampling, record_gaps, clock, on_done, free)
    saved = target.cache
    try:
        while requests or live or filling:
            while free and requests:
                slot = free.popleft()
                filling[slot] = run.start(slot, requests.popleft())
            if target.ragged_rows:  # newcomers' chunks ride in the step's forward; alone when no one decodes
                steps.append(run.step(live, filling) if live else run.prefill_round(live, filling))
            else:
                run.prefill_gap(live, filling)
                steps.append(run.step(live, filling) if live else None)
            run.flush()  # the leavers' records, then on_done (which may queue a conversation's next turn)
            if steps[-1] is None:
                steps.pop()
            else:
                steps[-1]["queued"] = len(requests)
    finally:
        target.cache = saved
    return steps


@dataclass
class _Run:
    """One generate_batch call's fixed parts, and its phases: start, prefill_chunk, step, leave."""

    target: TargetBackend
    drafters: list[Drafter]
    slots: SlotCaches
    max_new_tokens: int
    stop_ids: set[int]
    sampling: SamplingConfig
    record_gaps: bool
    clock: Callable[[], float]
    on_done: Callable
    free: deque
    leaving: list = field(default_factory=list)  # [(slot, _Live)] left, records not yet read back (flush)

    def start(self, slot: int, request: BatchRequest) -> _Live:
        """A newcomer takes `slot`: its cache emptied, its prompt's chunks queued."""
        admitted = self.clock()
        cache = self.target.cache = self.slots.slot[slot]
        cache.keep(0, None, 0)
        needs = self.drafters[slot].needs
        prefill = PromptPrefill(self.target, request.prompt_ids, needs.taps, successors_k=needs.prompt_successors)
        return _Live(request, admitted, prefill, generator=request.generator)

    def gap_room(self, spent: int) -> int | None:
        """Prompt positions a newcomer may still encode before the next step, `spent` already encoded since the
        last one: one chunk's worth (hardware.prefill_chunk); without a chunk size, one whole prompt."""
        chunk = self.target.prefill_chunk
        if chunk is None:
            return None if spent == 0 else 0
        return max(chunk - spent, 0)

    def prefill_gap(self, live: dict[int, _Live], filling: dict[int, _Live]) -> None:
        """Newcomers' chunks between two steps (a backend without segments), the oldest first: one chunk's worth of
        positions while sequences decode, back to back while none does."""
        spent = 0  # prompt positions encoded since the last step while sequences were decoding
        while filling:
            limit = self.gap_room(spent) if live else None
            if limit == 0:
                break
            slot = next(iter(filling))  # the oldest newcomer
            encoded = self.prefill_chunk(slot, filling[slot], limit)
            spent += encoded if live else 0
            self.prefilled(slot, live, filling)

    def prefill_chunk(self, slot: int, entry: _Live, limit: int | None = None) -> int:
        """Encode the newcomer's next chunk (at most `limit` positions) in a forward of its own; returns how many."""
        t0 = self.clock()
        self.target.cache = self.slots.slot[slot]
        encoded = entry.prefill.advance(limit)
        entry.prefill_s += self.clock() - t0
        return encoded

    def chunks(self, filling: dict[int, _Live], budget: int | None) -> list[Segment]:
        """The newcomers' next chunks as segments of one forward, the oldest first: `budget` prompt positions in
        all (None: each newcomer's next chunk)."""
        segments = []
        for slot, entry in filling.items():
            if budget is not None and budget <= 0:
                break
            segments.append(entry.prefill.segment(slot, budget))
            budget = None if budget is None else budget - segments[-1].length
        return segments

    def prefill_round(self, live: dict[int, _Live], filling: dict[int, _Live]) -> dict:
        """No sequence decodes: every newcomer's next chunk in one forward (a ragged backend)."""
        chunks = self.chunks(filling, None)
        taps = tuple(dict.fromkeys(tap for s in chunks for tap in filling[s.slot].prefill.taps))
        t0 = self.clock()
        outputs = self.target.forward_segments(self.slots, chunks, taps)
        self.took(chunks, outputs, taps, self.clock() - t0, live, filling)
        return {"slots": [], "nodes": 0, "positions": 0, "prefill": sum(s.length for s in chunks)}

    def took(self, chunks: list[Segment], outputs: list, taps: tuple, seconds: float, live, filling, rows=None):
        """The chunks' outputs handed to their newcomers, each charged its share of the forward's `seconds` (of
        `rows` positions in all; default: the chunks'); the prefilled ones start decoding."""
        total = rows or sum(s.length for s in chunks)
        for segment, output in zip(chunks, outputs):
            entry = filling[segment.slot]
            entry.prefill.take(_own_taps(output, taps, entry.prefill.taps, self.target.hidden_size), segment.length)
            entry.prefill_s += seconds * segment.length / total
            self.prefilled(segment.slot, live, filling)

    def prefilled(self, slot: int, live: dict[int, _Live], filling: dict[int, _Live]) -> None:
        """After a newcomer's last chunk: its first token and its drafter's reset (the batch-1 prefill's steps);
        it decodes from the next step, or leaves at once if that token ended it."""
        entry = filling[slot]
        if not entry.prefill.done:
            return
        t0 = self.clock()
        target, sampling = self.target, self.sampling
        target.cache = self.slots.slot[slot]
        prefill, ids = entry.prefill.output(), entry.request.prompt_ids
        entry.prefill = None
        if not sampling.greedy and not target.ops.on_host(prefill.logits):
            entry.generator = device_generator(entry.generator, prefill.logits.device)
        first = sample_token(prefill.logits[-1], sampling.temperature, sampling.top_p, entry.generator, ops=target.ops)
        gen = entry.gen = Generation(len(ids), [first], "max_new_tokens", prefill_s=0.0, wall_s=0.0)
        gen.slot = slot
        entry.state = SequenceState(tokens=list(ids) + [first], prompt_len=len(ids))
        if self.record_gaps:
            entry.top2.append(top2_logits(prefill.logits[-1:], 1))
        self.drafters[slot].reset(PrefillInfo(state=entry.state, forward=prefill))
        gen.prefill_s = entry.prefill_s + self.clock() - t0
        live[slot] = filling.pop(slot)
        if first in self.stop_ids or self.max_new_tokens <= 1:
            gen.stop_reason = "stop_token" if first in self.stop_ids else "max_new_tokens"
            self.leave(live, slot)

    def step(self, live: dict[int, _Live], filling: dict[int, _Live]) -> dict:
        """One batched step over the live slots, in phases: draft (lockstep), verify (one forward; on a ragged
        backend the newcomers' next chunks ride in it), accept and commit, extend (lockstep), record; the finished
        ones leave (their records are read at flush)."""
        clock = self.clock
        started = clock()
        proposals, draft_s = self.draft(live)
        if not proposals:
            return {"slots": [], "nodes": 0, "positions": 0, "prefill": 0}
        order = sorted(proposals)
        rows, topos = self.topologies(proposals)
        forwards, verify_s, positions, chunks = self.verify(proposals, topos, live, filling, rows)
        acceptances, kept, updates = self.accept_and_commit(proposals, topos, forwards, live)
        t2 = clock()
        self.lockstep(updates)  # extend: every slot's drafter learns from the verification, in lockstep
        extend_share = (clock() - t2) / max(len(updates), 1)
        for slot in updates:
            draft_s[slot] += extend_share
        gens = [live[slot].gen for slot in order]
        committed = [len(kept[slot]) for slot in order]
        record_steps(
            gens,
            [proposals[s] for s in order],
            [acceptances[s] for s in order],
            committed,
            [live[s].book for s in order],
        )
        for slot, gen in zip(order, gens):
            gen.draft_s.append(draft_s[slot])
            gen.verify_s.append(verify_s)
            if slot not in updates:  # done
                gen.other_s.append(max(0.0, clock() - started - draft_s[slot] - verify_s))
                self.leave(live, slot)
        ended = clock()
        for slot, entry in live.items():
            if slot in proposals and len(entry.gen.other_s) < len(entry.gen.verify_s):
                entry.gen.other_s.append(max(0.0, ended - started - draft_s[slot] - verify_s))
        nodes = sum(p.tree.num_nodes for p in proposals.values())
        return {"slots": order, "nodes": nodes, "positions": positions, "prefill": sum(c.length for c in chunks)}

    def topologies(self, proposals: dict) -> tuple[TreeRows | None, dict]:
        """Every tree's topology after its slot's prefix ({slot: Topology}): host trees' together (TreeRows, also
        returned: the segments' masks and positions are built from it in one pass), others one by one."""
        order, on_host = sorted(proposals), self.target.ops.on_host
        lengths = [self.slots.slot[slot].layers[0].length for slot in order]
        trees = [proposals[slot].tree for slot in order]
        rows = tree_rows([t.parents for t in trees], lengths) if all(on_host(t.parents) for t in trees) else None
        if rows is not None:
            return rows, dict(zip(order, rows.topologies()))
        return None, {
            slot: topology(t.parents, n, host=on_host(t.parents)) for slot, t, n in zip(order, trees, lengths)
        }

    def verify(
        self, proposals: dict, topos: dict, live: dict, filling: dict, rows: TreeRows | None = None
    ) -> tuple[dict, float, int, list]:
        """Every proposal's tree in one target forward: ({slot: ForwardOutput with the slot's drafter's taps}, the
        forward's seconds, the positions computed for trees, the newcomers' chunks that rode along: handed to them,
        each charged its share of the seconds)."""
        target, drafters, t0 = self.target, self.drafters, self.clock()
        taps = tuple(dict.fromkeys(tap for slot in proposals for tap in drafters[slot].needs.taps))
        if target.ragged_rows:
            chunks = self.chunks(filling, self.gap_room(0))
            every_tap = tuple(dict.fromkeys(taps + tuple(t for c in chunks for t in filling[c.slot].prefill.taps)))
            order = sorted(proposals)
            if rows is not None:  # every tree's masks and positions in one pass
                segments = tree_segments(order, [proposals[s].tree for s in order], rows=rows, dtype=target.dtype)
            else:
                segments = [tree_segment(slot, proposals[slot].tree, topos[slot], target.dtype) for slot in order]
            outputs = target.forward_segments(self.slots, segments + chunks, every_tap)
            seconds, rows = self.clock() - t0, sum(s.length for s in segments + chunks)
            self.took(chunks, outputs[len(segments) :], every_tap, seconds, live, filling, rows=rows)
            outputs = dict(zip(sorted(proposals), outputs[: len(segments)]))
            positions = sum(s.length for s in segments)
        else:
            chunks, every_tap = [], taps
            outputs, positions = self.verify_padded(proposals, topos, taps)
            seconds = self.clock() - t0
        own = {
            slot: _own_taps(outputs[slot], every_tap, drafters[slot].needs.taps, target.hidden_size)
            for slot in proposals
        }
        return own, seconds, positions, chunks

    def accept_and_commit(self, proposals: dict, topos: dict, forwards: dict, live: dict) -> tuple[dict, dict, dict]:
        """Every tree's acceptance in one call, then per slot the commit into its cache and the stop checks:
        ({slot: Acceptance}, {slot: tokens kept}, {slot: its drafter's update_steps} for the slots going on)."""
        target, order = self.target, sorted(proposals)
        decided = accept(
            [proposals[s].tree for s in order],
            [topos[s] for s in order],
            [forwards[s].logits for s in order],
            **self.sampling.accept_args([live[s].generator for s in order]),
            ops=target.ops,
        )
        acceptances, kept, updates = dict(zip(order, decided)), {}, {}
        for slot in order:
            entry, acceptance = live[slot], acceptances[slot]
            target.cache = self.slots.slot[slot]
            target.commit(topos[slot].cache_len, acceptance.path, acceptance.path_index)
            done, kept[slot] = keep_committed(entry.gen, entry.state, acceptance, self.max_new_tokens, self.stop_ids)
            if self.record_gaps:
                entry.top2.append(top2_logits(forwards[slot].logits[acceptance.index], len(kept[slot])))
            if not done:
                feedback = StepFeedback(proposals[slot], topos[slot], forwards[slot], acceptance, entry.state)
                updates[slot] = self.drafters[slot].update_steps(feedback)
        return acceptances, kept, updates

    def draft(self, live: dict[int, _Live]) -> tuple[dict, dict]:
        """Every live slot's proposal, cut to the context left ({slot: Proposal}, {slot: seconds}); a slot whose
        context is full leaves. The slots draft in lockstep (Drafter.propose_steps): each round, every slot's
        pending model call runs together (graft/drafter.py: run_calls, one head forward for all slots' frontiers);
        each slot is charged an equal share of the drafting seconds."""
        target, slots, clock = self.target, self.slots, self.clock
        t0 = clock()
        for slot in live:
            self.drafters[slot].lockstep = len(live)
        drafted = self.lockstep(
            {slot: self.drafters[slot].propose_steps(entry.state) for slot, entry in sorted(live.items())}
        )
        for slot in live:
            self.drafters[slot].lockstep = 1
        share = (clock() - t0) / max(len(drafted), 1)
        proposals, draft_s = {}, {}
        for slot, proposal in sorted(drafted.items()):
            room = target.max_context - slots.slot[slot].layers[0].length
            proposals[slot] = fit_to_context(proposal, room) if room >= 1 else proposal
            draft_s[slot] = share
        for slot in [s for s in sorted(live) if target.max_context - slots.slot[s].layers[0].length < 1]:
            live[slot].gen.stop_reason = "context"
            self.leave(live, slot)
            del proposals[slot]
        return proposals, draft_s

    def lockstep(self, steps: dict) -> dict:
        """Every slot's generator of model calls (Drafter.propose_steps, update_steps) run together: each round,
        every slot's pending call runs as one (graft/drafter.py: run_calls). {slot: the generator's value}."""
        pending, done = {}, {}
        for slot, step in steps.items():
            self.target.cache = self.slots.slot[slot]  # a drafter may read the target's cache (its length)
            _advance(step, slot, None, pending, done, first=True)
        while pending:
            calls = list(pending.items())
            pending = {}
            for (slot, _), result in zip(calls, run_calls([call for _, call in calls])):
                self.target.cache = self.slots.slot[slot]
                _advance(steps[slot], slot, result, pending, done)
        return done

    def verify_padded(self, proposals: dict, topos: dict, taps: tuple) -> tuple[dict, int]:
        """The trees verified as padded rows (a backend without segments): ({slot: ForwardOutput}, the positions
        the forward computed: rows x width, padding included)."""
        target, slots = self.target, self.slots
        first, rows, width = self.span(proposals)
        trees, row_topos = [], []
        for slot in range(first, first + rows):  # a slot not decoding verifies a lone token 0 after what it holds
            tree = proposals[slot].tree if slot in proposals else _padding(target.device)
            trees.append(tree)
            host = target.ops.on_host(tree.parents)
            row_topos.append(topos.get(slot) or topology(tree.parents, slots.slot[slot].layers[0].length, host=host))
        outputs = target.verify_rows(slots, first, trees, row_topos, taps, width=width)
        computed = rows * max(width or 0, *(t.num_nodes for t in trees))
        return {slot: outputs[slot - first] for slot in proposals}, computed

    def span(self, proposals: dict) -> tuple[int, int, int | None]:
        """(first slot, rows, width) of the step's forward. Fixed-size trees (a GPU) verify a fixed shape per bucket
        of live slots: a power-of-two count of rows, every tree padded to the widest drafter's; otherwise the slots
        from the first to the last proposing one, padded to the step's widest tree."""
        first, last = min(proposals), max(proposals)
        if not self.target.fixed_size_trees:
            return first, last - first + 1, None
        rows = rows_bucket(last - first + 1, len(self.drafters))
        return min(first, len(self.drafters) - rows), rows, max(d.max_nodes() for d in self.drafters)

    def leave(self, live: dict, slot: int) -> None:
        """The sequence in `slot` is done: its slot freed; its records are read back with the others that leave
        in the same step (`flush`)."""
        entry = live.pop(slot)
        entry.gen.wall_s = self.clock() - entry.admitted
        self.free.append(slot)
        self.leaving.append((slot, entry))

    def flush(self) -> None:
        """The sequences that left since the last flush: their records read back in one copy (decode.py's read
        for each, all at once: one host read for every leaver of a step), then handed to on_done."""
        leaving, self.leaving = self.leaving, []
        if leaving:
            read_kept([(e.gen, e.book, e.top2 if self.record_gaps else None) for _, e in leaving])
        for slot, entry in leaving:
            self.on_done(entry.request, entry.gen, slot)


def _advance(step, slot: int, result, pending: dict, drafted: dict, first: bool = False) -> None:
    """A slot's drafting generator one call further: its next call into `pending`, or its proposal into `drafted`."""
    try:
        pending[slot] = next(step) if first else step.send(result)
    except StopIteration as done:
        drafted[slot] = done.value


def _padding(device) -> DraftTree:
    return DraftTree.root_only(torch.zeros(1, dtype=torch.long, device=device), device)


def _own_taps(forward, batch_taps, own_taps, hidden_size: int):
    """The forward seen by one drafter: the taps it asked for, in its order, out of the batch's union."""
    if forward.hidden is None or tuple(own_taps) == tuple(batch_taps):
        return forward
    columns = [
        forward.hidden[:, i * hidden_size : (i + 1) * hidden_size] for i in (batch_taps.index(t) for t in own_taps)
    ]
    return type(forward)(logits=forward.logits, hidden=torch.cat(columns, dim=-1) if columns else None)
