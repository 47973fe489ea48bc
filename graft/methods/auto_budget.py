"""split auto and trim auto (beyond the paper): choose each step's tree size from the device's cost profile and the
draft's own confidence, instead of a fixed total_tokens.

After the draft is expanded, keeping the best N - 1 candidates (root included: N nodes) is expected to
commit E(N) = 1 + (sum of the N - 1 largest path probabilities exp(score)) tokens, the head's own estimate
of each node's chance to lie on the accepted path, plus the bonus token. The step then costs
draft + verify(N, context) + overhead(N) milliseconds, from the cost profile at `method.auto_context` cached
positions (the draft's own time is measured as it runs), and the split keeps the N that maximises E(N) / cost(N),
up to total_tokens. Where a node costs almost nothing (a GPU) that is the whole budget; where it costs compute
(a 2-core CPU) it is a small tree on uncertain steps and a larger one when the head is confident.

The profile (`method.cost_profile`): `auto` (the default) measures the loaded target where it runs when the
drafter is built, or loads that measurement from the cache (graft/budget/measure.py); a path reads a
profile file (python -m graft.costmodel profile), refused when it was measured on another model, dtype,
machine or engine (`method.cost_profile_mismatch=warn` uses it anyway).

At run.batch_size=B the profile is measured at B (one verify forward of B trees of N nodes), and each slot's
drafter costs its tree as its share of the batched step: its own draft + verify_B(N) / B + overhead(N). Where
the batch makes the forward compute-bound, a node's share grows and the chosen N shrinks. A profile file
measured at another batch than the run's is refused like another target's.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from graft.budget.measure import calibrated_profile, identity
from graft.budget.profile import CostProfile
from graft.drafter import SequenceState, StepFeedback
from graft.hub import from_cwd_or_repo
from graft.ops import upload
from graft.parts import Split, Trim
from graft.registry import register
from graft.schema import ConfigError, require
from graft.tree import DraftTree, NodeSource

log = logging.getLogger(__name__)


@dataclass
class CostParams:
    cost_profile: str = "auto"  # auto: measured here at start-up (cached); or a CostProfile JSON of this target
    cost_profile_mismatch: Literal["error", "warn"] = "error"  # a profile file measured for another target


def resolve_profile(params: CostParams, target, total_tokens: int, batch_size: int = 1) -> CostProfile:
    """The cost profile `params` name for `target` at `batch_size` sequences a step: measured (or cached) with
    `auto`, else read from the file and checked to be this target's (model, shape, dtype, machine, engine) at
    this batch size."""
    if params.cost_profile == "auto":
        return calibrated_profile(target, total_tokens, batch=batch_size)
    path = from_cwd_or_repo(params.cost_profile)  # profiles committed under results/ resolve anywhere
    if not path.is_file():
        raise ConfigError(f"method.cost_profile={params.cost_profile}: no such file (auto measures this machine's)")
    profile = CostProfile.load(path)
    here = identity(target)
    differ = [
        f"{key} {getattr(profile, key) or '?'!r} (here {value!r})"
        for key, value in here.items()
        if getattr(profile, key) != value
    ]
    if profile.batch != batch_size:  # a verify of B trees is not one tree's: the per-node share differs
        differ.append(f"batch size {profile.batch} (here run.batch_size={batch_size})")
    if differ:
        message = (
            f"method.cost_profile={params.cost_profile} was measured for another target: {'; '.join(differ)}; "
            "method.cost_profile=auto measures this one (method.cost_profile_mismatch=warn uses it anyway)"
        )
        if params.cost_profile_mismatch == "error":
            raise ConfigError(message)
        log.warning(message)
    return profile


@dataclass
class AutoParams(CostParams):
    auto_context: int = 512  # the context length whose verify costs the choice reads (cache positions)

    def __post_init__(self):
        require(self.auto_context >= 1, "method.auto_context", self.auto_context, "an integer >= 1 (cache positions)")


def best_budget(probabilities: Tensor, costs_ms: list[float]) -> int:
    """N in 1..len(costs_ms) maximising (1 + sum of the N - 1 largest probabilities) / costs_ms[N - 1]."""
    top = torch.sort(probabilities, descending=True).values[: len(costs_ms) - 1]  # [<= N_max - 1]
    return most_per_ms([1.0, *top.tolist()], costs_ms)


def most_per_ms(values: list[float], costs_ms: list[float]) -> int:
    """N in 1..min(len(values), len(costs_ms)) maximising (sum of the first N values) / costs_ms[N - 1] (the
    first such N): values in the order nodes would be kept, the root's first."""
    best, best_rate, expected = 1, -1.0, 0.0
    for n, (value, cost) in enumerate(zip(values, costs_ms), start=1):
        expected += value
        if expected / cost > best_rate:
            best, best_rate = n, expected / cost
    return best


def step_costs_ms(profile: CostProfile, nodes: int, context: int) -> list[float]:
    """verify(N) + the loop's overhead(N) ms for N = 1..nodes at `context` (a tree's accepted path moved); at a
    profile's batch B, one sequence's share of the forward of B trees of N nodes (verify_B(N) / B)."""
    return [profile.verify_share_ms(n, context) + profile.overhead_ms(n, accepted=2) for n in range(1, nodes + 1)]


@register(
    "split", "auto", params=AutoParams, description="per step, the tree size with the most expected tokens per ms"
)
class AutoSplit(Split):
    def __init__(self, params: AutoParams):
        self.params = params
        self.profile: CostProfile | None = None  # prepare() resolves it for the target
        self.context = params.auto_context
        self.draft_ms = 0.0  # running mean of this drafter's own draft time per step
        self.steps = 0
        self._costs: dict[int, list[float]] = {}

    def prepare(self, target, total_tokens: int, batch_size: int = 1) -> None:
        self.profile = resolve_profile(self.params, target, total_tokens, batch_size)

    def start(self) -> None:
        self.started = time.perf_counter()

    def _verify_costs(self, total_tokens: int) -> list[float]:
        """verify(N) + overhead(N) ms for N = 1..total_tokens, computed once per budget."""
        if total_tokens not in self._costs:
            self._costs[total_tokens] = step_costs_ms(self.profile, total_tokens, self.context)
        return self._costs[total_tokens]

    def keep(self, scores: Tensor, total_tokens: int) -> int:
        drafted = 1e3 * (time.perf_counter() - self.started) * self.time_share
        self.steps += 1
        self.draft_ms += (drafted - self.draft_ms) / self.steps
        costs = [self.draft_ms + c for c in self._verify_costs(total_tokens)]
        return best_budget(scores.float().exp(), costs)

    def levels_needed(self, total_tokens: int) -> int:
        return max(total_tokens - 2, 0)

    def widest_useful(self, total_tokens: int) -> int:
        return max(total_tokens - 1, 1)  # keep() reads the best total_tokens - 1 probabilities: the same values

    def label(self) -> str:
        return "auto"


PLACE_CAP = 8  # retrieved nodes deeper or later among their siblings than this share one place's counts
DRAFT_BINS = 10  # a draft node's conditional probability, in bins of 0.1
DRAFT_PRIOR = 4.0  # pseudo-trials at the head's own probability before a bin's counts take over


@dataclass
class TrimParams(CostParams):
    # Beta(hits, misses) prior of a retrieved node's acceptance given its parent's, before any is counted
    retrieval_prior: list[float] = field(default_factory=lambda: [1.0, 1.0])

    def __post_init__(self):
        if len(self.retrieval_prior) != 2 or min(self.retrieval_prior) <= 0:
            raise ValueError(f"retrieval_prior is (hits, misses) > 0; got {self.retrieval_prior}")


@register("trim", "auto", params=TrimParams, description="the united tree cut to the most expected tokens per ms")
class AutoTrim(Trim):
    """Each step: value every node of the united tree (the root 1; any other node its parent's value times its
    place's acceptance rate: a draft node's the head's probability of it, binned and calibrated by what was
    accepted, a retrieved node's counted at its depth and rank), keep nodes in order of value (a node never outvalues its
    parent, so every prefix is ancestor-closed), and cut at the N that maximises the expected committed tokens
    (the values' sum) per ms of the step: this drafter's own mean propose and update ms, verify(N) at the step's
    context and the loop's overhead(N) from the cost profile. total_tokens stays the cap."""

    def __init__(self, params: TrimParams):
        self.params = params
        self.profile: CostProfile | None = None  # prepare() resolves it for the target
        self.prior = tuple(params.retrieval_prior)
        self.counts: dict[tuple, list[int]] = {}  # a retrieved place or a draft bin -> [hits, trials], run-long
        self.propose_ms = self.update_ms = 0.0
        self.steps = self.updates = 0
        self.started = 0.0
        self.places: list[tuple | None] = []  # of the last cut tree's nodes (None: the root or an unscored node)
        self.kept_parents: list[int] = []
        self.expected = 1.0

    def prepare(self, target, total_tokens: int, batch_size: int = 1) -> None:
        self.profile = resolve_profile(self.params, target, total_tokens, batch_size)

    def start(self) -> None:
        self.started = time.perf_counter()

    def rate(self, place: tuple) -> float:
        """The chance that a node of `place` is accepted once its parent is: ("retrieved", depth, rank) from the
        Beta prior, ("draft", bin) from DRAFT_PRIOR trials at the bin's centre, plus what was counted."""
        hits, trials = self.counts.get(place, (0, 0))
        if place[0] == "draft":
            centre = (place[1] + 0.5) / DRAFT_BINS
            return (hits + DRAFT_PRIOR * centre) / (trials + DRAFT_PRIOR)
        return (hits + self.prior[0]) / (trials + self.prior[0] + self.prior[1])

    def values(self, tree: DraftTree) -> tuple[list[float], list[tuple | None], list[int]]:
        """Each node's value, its place (None: the root, or a node without a score), and the parents (host lists)."""
        parents = tree.parents.tolist()
        sources = tree.sources.tolist() if tree.sources is not None else [int(NodeSource.DRAFT)] * len(parents)
        scores = tree.scores.tolist() if tree.scores is not None else [-math.inf] * len(parents)
        n = len(parents)
        value, places, depth, retrieved_children = [1.0] * n, [None] * n, [0] * n, [0] * n
        for i in range(1, n):
            parent = parents[i]
            depth[i] = depth[parent] + 1
            if sources[i] == NodeSource.RETRIEVAL:
                rank = retrieved_children[parent]
                retrieved_children[parent] += 1
                places[i] = ("retrieved", min(depth[i], PLACE_CAP), min(rank, PLACE_CAP))
            elif scores[i] > -math.inf:  # the head's chance of this token after its parent's path
                own = math.exp(scores[i] - (scores[parent] if parent > 0 and scores[parent] > -math.inf else 0.0))
                places[i] = ("draft", min(int(own * DRAFT_BINS), DRAFT_BINS - 1))
            estimate = value[parent] * self.rate(places[i]) if places[i] is not None else 0.0
            value[i] = min(estimate, value[parent])
        return value, places, parents

    def costs_ms(self, nodes: int, context: int) -> list[float]:
        fixed = self.propose_ms + self.update_ms
        return [fixed + ms for ms in step_costs_ms(self.profile, nodes, context)]

    def cut(self, tree: DraftTree, state: SequenceState) -> DraftTree:
        self.steps += 1
        proposed = 1e3 * (time.perf_counter() - self.started) * self.time_share
        self.propose_ms += (proposed - self.propose_ms) / self.steps
        value, places, parents = self.values(tree)
        order = [0] + sorted(range(1, len(value)), key=value.__getitem__, reverse=True)  # stable: parents first
        count = most_per_ms([value[i] for i in order], self.costs_ms(len(order), len(state.tokens)))
        kept = sorted(order[:count])
        self.expected = sum(value[i] for i in kept)
        position = {node: j for j, node in enumerate(kept)}
        self.places = [places[i] for i in kept]
        self.kept_parents = [-1] + [position[parents[i]] for i in kept[1:]]
        if count == tree.num_nodes:
            return tree
        index = upload(kept, tree.tokens.device)
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        parents_kept = upload(self.kept_parents, tree.parents.device, tree.parents.dtype)
        return DraftTree(tree.tokens[index], parents_kept, pick(tree.scores), pick(tree.sources))

    def observe(self, step: StepFeedback, update_ms: float) -> None:
        self.updates += 1
        self.update_ms += (update_ms - self.update_ms) / self.updates
        on_path = set(step.acceptance.path)
        for i in range(1, min(len(self.places), step.proposal.tree.num_nodes)):  # the loop may verify a prefix
            place = self.places[i]
            if place is not None and self.kept_parents[i] in on_path:
                counts = self.counts.setdefault(place, [0, 0])
                counts[0] += i in on_path
                counts[1] += 1

    def note(self) -> dict:
        return {"trim_expected": round(self.expected, 3)}
