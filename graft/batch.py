"""Batched speculative decoding: up to B sequences decode together, one target forward verifying every live
sequence's tree per step, with continuous batching (a sequence that stops leaves its slot and the next request
takes it, so the batch stays full until the requests run out).

Per step: every live slot's drafter proposes its tree (draft); one forward verifies them all
(TargetBackend.verify_rows: each tree after its own slot's prefix, padded to the widest); then per slot, as in
graft/decode.py, acceptance, the commit into the slot's own cache (graft/backends/slots.py), the stop checks and
the drafter's update (extend). Each sequence keeps its own cache length, positions and drafter, so its tokens are
what batch-1 decoding gives, up to the float ties a batched product may move (graft/run/lossless.py decides).

A newcomer is prefilled alone when it takes its slot, in the target's prefill chunks (hardware.prefill_chunk),
while the other slots wait; this is the plain torch path's batching (the transformers forward): the CPU engine
and the fixed-shape GPU buckets verify one sequence at a time.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from graft.acceptance import accept_greedy, accept_sampling, sample_token
from graft.backends.slots import SlotCaches
from graft.backends.target import TargetBackend
from graft.decode import Generation, SamplingConfig, _top2, keep_committed, read_back, record_step
from graft.drafter import Drafter, PrefillInfo, Proposal, SequenceState, StepFeedback
from graft.tree import DraftTree, topology


@dataclass
class BatchRequest:
    """One sequence to decode: its prompt ids, its sampling generator, and the caller's key (`tag`)."""

    prompt_ids: list[int]
    generator: torch.Generator | None = None
    tag: Any = None


@dataclass
class _Live:
    request: BatchRequest
    state: SequenceState
    gen: Generation
    admitted: float
    top2: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    kept: list = field(default_factory=list)


def slot_capacity(prompt_lens: list[int], max_new_tokens: int, max_nodes: int) -> int:
    """Positions a slot needs: the longest prompt, its answer and the widest tree of a step (padding included)."""
    return max(prompt_lens) + max_new_tokens + max_nodes + 8


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
    one entry per step: the live slots and the nodes verified (the batch's own record)."""
    slots = SlotCaches(target, len(drafters), capacity, ops=target.ops)
    free, live, steps = deque(range(len(drafters))), {}, []
    saved = target.cache
    try:
        while requests or live:
            while free and requests:
                slot = free.popleft()
                entry = _admit(
                    target,
                    drafters[slot],
                    slots,
                    slot,
                    requests.popleft(),
                    max_new_tokens,
                    stop_ids,
                    sampling,
                    record_gaps,
                    clock,
                )
                if entry.gen.stop_reason == "done":
                    entry.gen.stop_reason = "stop_token" if entry.gen.new_tokens[-1] in stop_ids else "max_new_tokens"
                    _finish(entry, clock, record_gaps)
                    on_done(entry.request, entry.gen, slot)
                    free.append(slot)
                else:
                    live[slot] = entry
            if live:
                steps.append(
                    _step(
                        target,
                        drafters,
                        slots,
                        live,
                        free,
                        max_new_tokens,
                        stop_ids,
                        sampling,
                        record_gaps,
                        clock,
                        on_done,
                    )
                )
    finally:
        target.cache = saved
    return steps


def _admit(target, drafter, slots, slot, request, max_new_tokens, stop_ids, sampling, record_gaps, clock) -> _Live:
    """Prefill the request into its slot and reset the slot's drafter (the batch-1 prefill, on the slot's cache)."""
    admitted = clock()
    cache = target.cache = slots.slot[slot]
    cache.keep(0, None, 0)
    ids = request.prompt_ids
    prefill = target.prefill(ids, drafter.needs.taps, successors_k=drafter.needs.prompt_successors)
    first = sample_token(prefill.logits[-1], sampling.temperature, sampling.top_p, request.generator)
    gen = Generation(prompt_len=len(ids), new_tokens=[first], stop_reason="max_new_tokens", prefill_s=0.0, wall_s=0.0)
    gen.slot = slot
    entry = _Live(request, SequenceState(tokens=list(ids) + [first], prompt_len=len(ids)), gen, admitted)
    if record_gaps:
        entry.top2.append(_top2(prefill.logits[-1:], 1))
    drafter.reset(PrefillInfo(state=entry.state, forward=prefill))
    gen.prefill_s = clock() - admitted
    if first in stop_ids or max_new_tokens <= 1:
        gen.stop_reason = "done"
    return entry


def _step(target, drafters, slots, live, free, max_new_tokens, stop_ids, sampling, record_gaps, clock, on_done) -> dict:
    """One batched step over the live slots; the finished ones leave."""
    started = clock()
    proposals, draft_s = {}, {}
    for slot, entry in sorted(live.items()):
        target.cache = slots.slot[slot]
        t0 = clock()
        proposal = drafters[slot].propose(entry.state)
        room = target.max_context - target.cache_len
        if room >= 1 and proposal.tree.num_nodes > room:  # near the end of the context: what fits (decode.py)
            proposal = Proposal(proposal.tree.first(room), {**proposal.note, "fitted_to_context": room})
        proposals[slot], draft_s[slot] = proposal, clock() - t0
    for slot in [s for s in sorted(live) if target.max_context - slots.slot[s].layers[0].length < 1]:
        live[slot].gen.stop_reason = "context"
        _leave(live, free, slot, clock, record_gaps, on_done)
        del proposals[slot]
    if not proposals:
        return {"slots": [], "nodes": 0}
    first, last = min(proposals), max(proposals)
    trees, topos = [], []
    for slot in range(first, last + 1):  # a free slot inside the span verifies a lone token 0 at position 0
        tree = (
            proposals[slot].tree
            if slot in proposals
            else DraftTree.root_only(torch.zeros(1, dtype=torch.long, device=target.device), target.device)
        )
        length = slots.slot[slot].layers[0].length if slot in proposals else 0
        trees.append(tree)
        topos.append(topology(tree.parents, length, host=target.ops.on_host(tree.parents)))
    taps = tuple(dict.fromkeys(tap for slot in proposals for tap in drafters[slot].needs.taps))
    t1 = clock()
    outputs = target.verify_rows(slots, first, trees, topos, taps)
    verify_s = clock() - t1
    for slot, proposal in sorted(proposals.items()):
        entry, tree, topo = live[slot], proposal.tree, topos[slot - first]
        forward = _own_taps(outputs[slot - first], taps, drafters[slot].needs.taps, target.hidden_size)
        target.cache = slots.slot[slot]
        if sampling.greedy:
            acceptance = accept_greedy(tree, topo, forward.logits, target.ops)
        else:
            acceptance = accept_sampling(
                tree, forward.logits, sampling.temperature, sampling.top_p, entry.request.generator
            )
        target.commit(topo.cache_len, acceptance.path, acceptance.path_index)
        gen = entry.gen
        done, committed = keep_committed(gen, entry.state, acceptance, max_new_tokens, stop_ids)
        if record_gaps:
            entry.top2.append(_top2(forward.logits[acceptance.index], len(committed)))
        t2 = clock()
        if not done:
            drafters[slot].update(
                StepFeedback(
                    proposal=proposal, topology=topo, forward=forward, acceptance=acceptance, state=entry.state
                )
            )
        draft_s[slot] += clock() - t2
        record_step(gen, proposal.note, tree, acceptance, len(committed), entry.sources, entry.kept)
        gen.draft_s.append(draft_s[slot])
        gen.verify_s.append(verify_s)
        if done:
            gen.other_s.append(max(0.0, clock() - started - draft_s[slot] - verify_s))
            _leave(live, free, slot, clock, record_gaps, on_done)
    ended = clock()
    for slot, entry in live.items():
        if slot in proposals and len(entry.gen.other_s) < len(entry.gen.verify_s):
            entry.gen.other_s.append(max(0.0, ended - started - draft_s[slot] - verify_s))
    return {"slots": sorted(proposals), "nodes": sum(p.tree.num_nodes for p in proposals.values())}


def _own_taps(forward, batch_taps, own_taps, hidden_size: int):
    """The forward seen by one drafter: the taps it asked for, in its order, out of the batch's union."""
    if forward.hidden is None or tuple(own_taps) == tuple(batch_taps):
        return forward
    columns = [
        forward.hidden[:, i * hidden_size : (i + 1) * hidden_size] for i in (batch_taps.index(t) for t in own_taps)
    ]
    return type(forward)(logits=forward.logits, hidden=torch.cat(columns, dim=-1) if columns else None)


def _leave(live, free, slot, clock, record_gaps, on_done) -> None:
    entry = live.pop(slot)
    _finish(entry, clock, record_gaps)
    free.append(slot)
    on_done(entry.request, entry.gen, slot)


def _finish(entry: _Live, clock, record_gaps: bool) -> None:
    """The sequence's records read back once, as decode.py does at the end of a sequence."""
    entry.gen.wall_s = clock() - entry.admitted
    read_back(entry.gen, entry.sources, entry.kept, entry.top2 if record_gaps else None)
