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

from dataclasses import dataclass, field

import torch

from graft.acceptance import (
    accept_greedy,
    accept_sampling,
    accept_sampling_on_device,
    device_generator,
    sample_token,
)
from graft.backends.target import TargetBackend
from graft.drafter import Drafter, PrefillInfo, Proposal, SequenceState, StepFeedback
from graft.fixed_size import resolve_deferred
from graft.tree import NodeSource, topology


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


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


def _top2(logits: torch.Tensor, count: int) -> torch.Tensor:
    return logits.topk(2, dim=-1).values[:count]  # [count, 2], left on the device until the end


def _count_sources(sources: torch.Tensor) -> torch.Tensor:
    """[len(NodeSource)] nodes per source; a fixed-size scatter, where bincount would sync to size its output."""
    counts = torch.zeros(len(NodeSource), dtype=torch.long, device=sources.device)
    return counts.scatter_add_(0, sources, torch.ones_like(sources))


def _source_counts(tree, acceptance) -> torch.Tensor:
    """[4]: draft and retrieved nodes in the tree, then among the accepted nodes (stays on the device)."""
    src = tree.node_sources()  # [num_nodes]
    in_tree = _count_sources(src)
    accepted = _count_sources(src[acceptance.index])
    return torch.stack(
        [
            in_tree[NodeSource.DRAFT],
            in_tree[NodeSource.RETRIEVAL],
            accepted[NodeSource.DRAFT],
            accepted[NodeSource.RETRIEVAL],
        ]
    )


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
    first = sample_token(prefill.logits[-1], sampling.temperature, sampling.top_p, generator)
    gen = Generation(
        prompt_len=len(prompt_ids), new_tokens=[first], stop_reason="max_new_tokens", prefill_s=0.0, wall_s=0.0
    )
    if record_gaps:
        top2 = [_top2(prefill.logits[-1:], 1)]
    state = SequenceState(tokens=list(prompt_ids) + [first], prompt_len=len(prompt_ids))
    drafter.reset(PrefillInfo(state=state, forward=prefill))
    prefilled = clock.mark()
    marks = []  # per step the seven marks of graft/clock.py: StepMarks
    done = first in stop_ids or max_new_tokens <= 1
    if first in stop_ids:
        gen.stop_reason = "stop_token"
    context_limit = target.max_context
    sources = []  # per step [4] counts, left on the device until the end
    kept = []  # per step 0-d: filled slots, the same

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
        if tree.num_nodes > room:
            # near the end of the context verify what fits, down to the root alone (a plain decode step),
            # so that every method commits the baseline's tokens up to max_new_tokens
            tree = tree.first(room)
            proposal = Proposal(tree, {**proposal.note, "fitted_to_context": room})
        topo = topology(tree.parents, committed_len, host=target.ops.on_host(tree.parents))
        t2 = clock.mark()
        forward = target.verify(tree, topo, taps)  # verify
        t3 = clock.mark()
        if sampling.greedy:
            acceptance = accept_greedy(tree, topo, forward.logits, target.ops)
        elif target.ops.on_host(forward.logits):
            acceptance = accept_sampling(tree, forward.logits, sampling.temperature, sampling.top_p, generator)
        else:
            acceptance = accept_sampling_on_device(
                tree, topo, forward.logits, sampling.temperature, sampling.top_p, generator
            )
        target.commit(committed_len, acceptance.path, acceptance.path_index)

        done, committed = keep_committed(gen, state, acceptance, max_new_tokens, stop_ids)
        if record_gaps:
            top2.append(_top2(forward.logits[acceptance.index], len(committed)))
        t4 = clock.mark()
        if not done:  # extend: the drafter learns from the verification for the next step
            drafter.update(
                StepFeedback(proposal=proposal, topology=topo, forward=forward, acceptance=acceptance, state=state)
            )
        t5 = clock.mark()

        record_step(gen, proposal.note, tree, acceptance, len(committed), sources, kept)
        marks.append((t0, t1, t2, t3, t4, t5, clock.mark()))

    times = clock.step_times(start, prefilled, marks, clock.mark())
    gen.prefill_s, gen.wall_s = times.prefill_s, times.wall_s
    gen.draft_s, gen.verify_s, gen.other_s = times.draft_s, times.verify_s, times.other_s
    read_back(gen, sources, kept, top2 if record_gaps else None)
    return gen


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


def record_step(gen: Generation, note: dict, tree, acceptance, committed: int, sources: list, kept: list) -> None:
    """A step's record: the drafter's note, its accepted length and nodes; the source counts and the filled
    slots stay on the device (`sources`, `kept`) until read_back."""
    if note:
        gen.step_info.append(note)
    sources.append(_source_counts(tree, acceptance))
    kept.append((tree.tokens >= 0).sum())
    gen.accept_lengths.append(committed)
    gen.nodes.append(tree.num_nodes)


def read_back(gen: Generation, sources: list, kept: list, top2: list | None) -> None:
    """What a sequence kept on the device, read back once at its end: deferred figures, source counts, filled
    slots and (with `top2`) the top-2 logits of every new token."""
    resolve_deferred(gen.step_info)  # figures fixed-size trees kept on the device, in one copy
    if sources:
        gen.step_sources = torch.stack(sources).tolist()
        gen.kept_nodes = torch.stack(kept).tolist()
    if top2 is not None:
        host = torch.cat(top2).tolist()
        gen.top2_gaps = [a - b for a, b in host]
        gen.top_logits = [a for a, _ in host]
