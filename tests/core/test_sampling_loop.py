"""Sampling is lossless through the whole loop, not only in the acceptance function: the first two tokens
that generate() samples with a tree drafter follow the target's own distribution, computed here
independently (plain forwards, softmax, nucleus), and the test fails on a loop that accepts greedily."""

import numpy as np
import pytest
import torch
from conftest import make_drafter
from scipy.stats import chisquare

import graft.acceptance as acceptance
from graft.acceptance import accept_greedy
from graft.data.loading import BUILTIN
from graft.decode import SamplingConfig, generate
from graft.drafter import Drafter, Proposal, SequenceState
from graft.tree import DraftTree, NodeSource, topology

pytestmark = pytest.mark.slow  # chi-square tests of 2,000 draws each (about 35 s): `make test-fast` leaves it out

TEMPERATURE, TOP_P, DRAWS = 0.5, 0.95, 2000


def nucleus(logits: torch.Tensor) -> torch.Tensor:
    """softmax(logits / T) cut to the smallest top set whose mass reaches TOP_P, renormalised."""
    probs = torch.softmax(logits.double() / TEMPERATURE, dim=-1)
    ranked, order = probs.sort(descending=True)
    keep = (ranked.cumsum(0) - ranked) < TOP_P
    out = torch.zeros_like(probs)
    out[order[keep]] = ranked[keep]
    return out / out.sum()


def joint_distribution(target, prompt: list[int]) -> dict[tuple[int, int], float]:
    """P(t1, t2) from plain prefills of the prompt and of the prompt + each possible t1."""
    target.reset(len(prompt) + 4)
    first = nucleus(target.prefill(prompt).logits[-1])
    joint = {}
    for t1 in torch.nonzero(first).flatten().tolist():
        target.reset(len(prompt) + 4)
        second = nucleus(target.prefill(prompt + [t1]).logits[-1])
        for t2 in torch.nonzero(second).flatten().tolist():
            joint[(t1, t2)] = float(first[t1] * second[t2])
    return joint


class LikelyChildren(Drafter):
    """Roots each tree with the three tokens the target most likely samples after the root (and a chain
    below the first), so that draft tokens are accepted often and rejection is exercised too."""

    def __init__(self, target, likely: dict[int, list[int]]):
        super().__init__(target)
        self.likely = likely

    def max_nodes(self) -> int:
        return 5

    def propose(self, state: SequenceState) -> Proposal:
        children = self.likely.get(state.root, [])[:3]
        tokens = [state.root, *children] + ([children[0]] if children else [])
        parents = [-1] + [0] * len(children) + ([1] if children else [])
        tree = DraftTree.build(torch.tensor(tokens), torch.tensor(parents), NodeSource.DRAFT)
        return Proposal(tree)


def draw_pairs(target, drafter, prompt) -> tuple[list[tuple[int, int]], int]:
    """DRAWS samples of the first two tokens, and how many draws accepted a draft token."""
    sampling = SamplingConfig(temperature=TEMPERATURE, top_p=TOP_P)
    pairs, accepted_drafts = [], 0
    for seed in range(DRAWS):
        generator = torch.Generator().manual_seed(seed)
        out = generate(target, drafter, prompt, 2, set(), sampling, generator)
        pairs.append(tuple(out.new_tokens[:2]))
        accepted_drafts += out.step_sources[0][2] > 0  # [draft, retrieved, accepted draft, accepted retrieved]
    return pairs, accepted_drafts


def chi_square_p(pairs, joint) -> float:
    """Cells with an expected count of at least 5, the rest pooled into one."""
    expected = {cell: p * len(pairs) for cell, p in joint.items()}
    big = sorted(cell for cell, e in expected.items() if e >= 5)
    observed = [sum(1 for pair in pairs if pair == cell) for cell in big]
    observed.append(len(pairs) - sum(observed))
    wanted = [expected[cell] for cell in big] + [len(pairs) - sum(expected[cell] for cell in big)]
    return float(chisquare(np.array(observed), np.array(wanted)).pvalue)


@pytest.fixture(scope="module")
def setting(request):
    from conftest import load_tiny

    loaded = load_tiny("tiny_llama")
    prompt = loaded.chat.prompt_ids([{"role": "user", "content": BUILTIN[2].turns[0]}])[:24]
    joint = joint_distribution(loaded.target, prompt)
    likely: dict[int, list[int]] = {}
    for (t1, t2), _ in sorted(joint.items(), key=lambda kv: -kv[1]):
        likely.setdefault(t1, []).append(t2)
    return loaded.target, prompt, joint, likely


@pytest.mark.parametrize("drafter", ["likely_children", "graft"])
def test_the_loop_samples_the_target_distribution(setting, drafter):
    target, prompt, joint, likely = setting
    proposer = LikelyChildren(target, likely) if drafter == "likely_children" else make_drafter("graft", target)
    pairs, accepted_drafts = draw_pairs(target, proposer, prompt)
    if drafter == "likely_children":  # draft tokens really are accepted (and rejected): acceptance is exercised
        assert DRAWS // 10 < accepted_drafts < DRAWS - DRAWS // 10, accepted_drafts
    assert chi_square_p(pairs, joint) > 1e-3


def test_a_loop_that_accepts_greedily_under_sampling_is_caught(setting, monkeypatch):
    """The check above must fail on a broken loop: greedy acceptance while sampling."""
    target, prompt, joint, likely = setting
    monkeypatch.setattr(
        acceptance,
        "accept_sampling",
        lambda tree, logits, *args, **kwargs: accept_greedy(tree, topology(tree.parents, 0), logits),
    )
    pairs, _ = draw_pairs(target, LikelyChildren(target, likely), prompt)
    assert chi_square_p(pairs, joint) < 1e-6


def draw_pairs_batched(target, drafters, prompt) -> tuple[list[tuple[int, int]], int]:
    """draw_pairs through graft/batch.py: the DRAWS sequences len(drafters) at a time, each with its own seed."""
    from collections import deque

    from graft.batch import BatchRequest, generate_batch, slot_capacity

    sampling = SamplingConfig(temperature=TEMPERATURE, top_p=TOP_P)
    queue = deque(BatchRequest(prompt, torch.Generator().manual_seed(seed), seed) for seed in range(DRAWS))
    found = {}
    capacity = slot_capacity([len(prompt)], 2, drafters[0].max_nodes())
    generate_batch(
        target, drafters, queue, 2, set(), sampling, capacity, lambda r, gen, slot: found.__setitem__(r.tag, gen)
    )
    pairs = [tuple(found[seed].new_tokens[:2]) for seed in range(DRAWS)]
    return pairs, sum(found[seed].step_sources[0][2] > 0 for seed in range(DRAWS))


@pytest.mark.parametrize("path", ["host", "device"])
def test_a_batch_of_four_samples_the_target_distribution(setting, path, monkeypatch):
    """run.batch_size=4: each sequence of the batch samples the target's distribution, its draft tokens accepted
    and rejected as alone; on the host walk (a CPU) and on the device path a GPU takes (every slot's draws made
    there, read back in one copy)."""
    from graft.ops import Ops

    if path == "device":
        monkeypatch.setattr(Ops, "on_host", lambda self, t: False)
    target, prompt, joint, likely = setting
    pairs, accepted_drafts = draw_pairs_batched(target, [LikelyChildren(target, likely) for _ in range(4)], prompt)
    assert DRAWS // 10 < accepted_drafts < DRAWS - DRAWS // 10, accepted_drafts
    assert chi_square_p(pairs, joint) > 1e-3


def test_a_batch_that_accepts_greedily_under_sampling_is_caught(setting, monkeypatch):
    target, prompt, joint, likely = setting
    monkeypatch.setattr(
        acceptance,
        "accept_sampling",
        lambda tree, logits, *args, **kwargs: accept_greedy(tree, topology(tree.parents, 0), logits),
    )
    pairs, _ = draw_pairs_batched(target, [LikelyChildren(target, likely) for _ in range(4)], prompt)
    assert chi_square_p(pairs, joint) < 1e-6


def test_a_device_batch_that_accepts_greedily_under_sampling_is_caught(setting, monkeypatch):
    from graft.acceptance import greedy_pending
    from graft.ops import Ops

    monkeypatch.setattr(Ops, "on_host", lambda self, t: False)
    monkeypatch.setattr(
        acceptance, "sampling_pending", lambda tree, topo, logits, *args, **kwargs: greedy_pending(tree, topo, logits)
    )
    target, prompt, joint, likely = setting
    pairs, _ = draw_pairs_batched(target, [LikelyChildren(target, likely) for _ in range(4)], prompt)
    assert chi_square_p(pairs, joint) < 1e-6
