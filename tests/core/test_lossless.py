"""Greedy output of every drafter equals the autoregressive baseline's, token for token."""

import random

import pytest
import torch
from conftest import make_drafter

from baselines.autoregressive import Autoregressive
from graft.config.hydra_setup import group_options
from graft.data.loading import BUILTIN
from graft.decode import SamplingConfig, generate
from graft.drafter import Drafter, Proposal, SequenceState
from graft.run.lossless import float_tie
from graft.tree import DraftTree, NodeSource

TINY = ["tiny_llama", "tiny_qwen3", "tiny_qwen3_moe", "tiny_llama:packed", "tiny_qwen3:packed", "tiny_qwen3_moe:bf16"]
MAX_NEW = 48


class RandomTreeDrafter(Drafter):
    """Random trees of varied shape; one branch follows the reference continuation to a random depth,
    at a random child position, with random siblings and duplicate tokens around it."""

    def __init__(self, target, reference: list[int], prompt_len: int, seed: int, max_nodes: int = 24):
        super().__init__(target)
        self.reference, self.prompt_len = reference, prompt_len
        self.rng = random.Random(seed)
        self._max = max_nodes

    def max_nodes(self) -> int:
        return self._max

    def propose(self, state: SequenceState) -> Proposal:
        rng, vocab = self.rng, self.target.vocab_size
        done = len(state.tokens) - self.prompt_len
        truth = self.reference[done : done + rng.randint(0, 8)]
        n_nodes = rng.randint(1, self._max)
        tokens, parents = [state.root], [-1]
        truth_node, truth_depth = 0, 0
        while len(tokens) < n_nodes:
            if truth_depth < len(truth) and rng.random() < 0.4:
                parent, token = truth_node, truth[truth_depth]
                truth_node, truth_depth = len(tokens), truth_depth + 1
            else:
                parent = rng.randrange(len(tokens))
                token = rng.choice(tokens) if rng.random() < 0.2 else rng.randrange(vocab)
            tokens.append(token)
            parents.append(parent)
        sources = torch.full((len(tokens),), int(NodeSource.TEST), dtype=torch.int8)
        tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), sources=sources)
        tree.validate()
        return Proposal(tree)


def assert_lossless(model, out, base, what):
    """Equal tokens; in bf16, a first divergence where the baseline's top-2 gap is a float tie is allowed."""
    if out.new_tokens == base.new_tokens:
        return
    assert model.target.dtype != torch.float32, f"{what} diverged in float32"
    pos = next(i for i, (a, b) in enumerate(zip(out.new_tokens, base.new_tokens)) if a != b)
    gap, top = base.top2_gaps[pos], base.top_logits[pos]
    assert float_tie(gap, top, model.target.dtype), (
        f"{what} diverged at {pos}; baseline top-2 gap {gap:.3g} at logit {top:.3g}"
    )


def _prompt_ids(model, k):
    return model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])


# every method under configs/method/ runs with its defaults; these add variants (overrides of its keys)
VARIANTS = {
    "eagle3": [
        {},
        {"random_kind": "eagle1", "total_tokens": 16, "depth": 4, "top_k": 4},
        {"total_tokens": 8, "depth": 7, "top_k": 1},
    ],
    # thresholds pick the stage: a random head is unsure, so 0.35 fires at the root; 0 never fires (dense)
    "pruned": [{}, {"thresholds": [0.0, 0.0, 1.0]}, {"thresholds": [0.0, 0.0, 0.0], "total_tokens": 16}],
    "graft": [
        {},
        {"thresholds": [0.0, 1.0, 1.0], "total_tokens": 16},
        {"attach": "both", "retrieval": "both"},
        {"attach": "leaves", "thresholds": [0.0, 0.0, 1.0], "total_tokens": 32},
        {"retrieval": ["suffix"], "total_tokens": 8},
    ],
    "graft_root": [{"total_tokens": 32}],
    "graft_noprune": [{"thresholds": [0.0, 1.0, 1.0]}],
    "graft_tail": [{}, {"tail_threshold": 0.0, "total_tokens": 16}],
    "graft_refill": [{}, {"thresholds": [1.0, 1.0, 1.0], "total_tokens": 16}],
    "samd": [{}, {"suffix_min_match": 1, "total_tokens": 16}],
    "dflash": [{}, {"block_size": 4}, {"random_layers": 2, "total_tokens": 6}],
    "dflash_graft": [{}, {"prefix_threshold": 0.0, "total_tokens": 12}, {"refill": True, "total_tokens": 12}],
    "dflash_tree": [{}, {"top_k": 2, "thresholds": [0.0, 0.0, 0.0], "total_tokens": 24}],
}


# the fast forward paths change only the target's arithmetic: one tree drafter of each kind covers them
FAST_PATH_METHODS = {
    "pld": [{}],
    "eagle3": [{}],
    "graft": [{"attach": "both", "retrieval": "both", "thresholds": [0.0, 1.0, 1.0]}],
    "dflash_graft": [{}],
}


def _drafters(target, variants: dict | None = None):
    for method in group_options("method") if variants is None else variants:
        for params in (variants or VARIANTS).get(method, [{}]):
            yield f"{method} {params}", make_drafter(method, target, **params)


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_every_registered_method_is_lossless(tiny, name):
    model = tiny(name)
    drafters = list(_drafters(model.target, FAST_PATH_METHODS if ":" in name else None))
    for k in range(3):
        ids = _prompt_ids(model, k)
        base = generate(model.target, Autoregressive(model.target), ids, MAX_NEW, model.stop_ids, record_gaps=True)
        assert base.tau == 1.0
        for what, drafter in drafters:
            out = generate(model.target, drafter, ids, MAX_NEW, model.stop_ids)
            assert_lossless(model, out, base, f"{what} on prompt {k}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_moe"])
def test_every_method_samples_through_the_loop(tiny, name):
    model = tiny(name)
    for what, drafter in _drafters(model.target):
        gen = torch.Generator().manual_seed(1)
        out = generate(model.target, drafter, _prompt_ids(model, 2), 32, model.stop_ids, SamplingConfig(0.9, 0.95), gen)
        assert 1 <= len(out.new_tokens) <= 32, what
        assert sum(out.accept_lengths) == out.step_tokens, what


@pytest.mark.parametrize("name", TINY)
def test_random_trees_are_lossless_and_accept(tiny, name):
    model = tiny(name)
    accepted_beyond_bonus = 0
    for k in range(3):
        ids = _prompt_ids(model, k)
        base = generate(model.target, Autoregressive(model.target), ids, MAX_NEW, model.stop_ids, record_gaps=True)
        for seed in range(3):
            drafter = RandomTreeDrafter(model.target, base.new_tokens, len(ids), seed=seed + 10 * k)
            out = generate(model.target, drafter, ids, MAX_NEW, model.stop_ids)
            assert_lossless(model, out, base, f"random tree seed {seed} on prompt {k}")
            assert max(out.nodes) > 1
            accepted_beyond_bonus += sum(a - 1 for a in out.accept_lengths)
    assert accepted_beyond_bonus > 20  # the trees did get accepted, so compaction of deep paths was exercised


def test_pld_accepts_on_repetitive_text(tiny):
    model = tiny("tiny_llama")
    ids = _prompt_ids(model, 0)
    out = generate(model.target, make_drafter("pld", model.target), ids, 96, model.stop_ids)
    assert out.tau > 1.0


def test_sampling_runs_through_the_same_loop(tiny):
    model = tiny("tiny_qwen3")
    ids = _prompt_ids(model, 1)
    gen = torch.Generator().manual_seed(0)
    out = generate(
        model.target, make_drafter("pld", model.target), ids, 32, model.stop_ids, SamplingConfig(0.8, 0.95), gen
    )
    assert 1 <= len(out.new_tokens) <= 32
    assert sum(out.accept_lengths) == out.step_tokens


@pytest.mark.parametrize("method", ["graft", "eagle3", "recycling"])
def test_near_the_context_limit_trees_shrink_and_every_token_is_still_produced(tiny, method):
    """A prompt admitted because prompt + max_new_tokens fits the context must get all its tokens from a
    tree method too: near the end the loop verifies only the nodes that fit, down to the root alone."""
    loaded = tiny("tiny_llama")
    target = loaded.target
    prompt = loaded.chat.prompt_ids([{"role": "user", "content": BUILTIN[0].turns[0]}])[:40]
    max_new = 32
    saved = target.max_context
    target.max_context = len(prompt) + max_new  # exactly what the runner admits
    try:
        base = generate(target, Autoregressive(target), prompt, max_new, set(), record_gaps=True)
        out = generate(target, make_drafter(method, target), prompt, max_new, set())
    finally:
        target.max_context = saved
    assert len(base.new_tokens) == max_new and base.stop_reason == "max_new_tokens"
    assert out.new_tokens == base.new_tokens and out.stop_reason == "max_new_tokens"
    fitted = [info["fitted_to_context"] for info in out.step_info if "fitted_to_context" in info]
    assert fitted, "no step reached the context limit: the test would not exercise the shrink"


# fixed-size trees (hardware.fixed_size_trees, the GPU default): the methods whose parts decide on the device
STATIC_VARIANTS = {
    "eagle3": [{}],
    "pruned": [{}, {"thresholds": [0.0, 0.0, 1.0]}, {"thresholds": [0.0, 0.0, 0.0], "total_tokens": 16}],
    "graft": [{}, {"thresholds": [0.0, 1.0, 1.0], "total_tokens": 16}, {"thresholds": [0.0, 0.0, 1.0]}],
    "graft_root": [{"total_tokens": 32}],
    "graft_noprune": [{"thresholds": [0.0, 1.0, 1.0]}],
    "recycling": [{}],
}


def assert_fixed_sizes(drafter, out, what: str) -> None:
    """One size per step; a method that prunes: its kept nodes rounded up to a bucket of drafter.bucket slots."""
    sizes, kept = out.nodes[:-1], out.kept_nodes[:-1]  # the last step may be cut to max_new_tokens
    assert all(k <= n for k, n in zip(out.kept_nodes, out.nodes)), what
    if not drafter.bucket:
        assert len(set(sizes)) <= 1, f"{what}: tree sizes {set(out.nodes)}"
        return
    budget = drafter.max_nodes()
    want = [min(budget, -(-k // drafter.bucket) * drafter.bucket) for k in kept]
    assert sizes == want, f"{what}: verified {sizes}, kept {kept}"


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3_moe"])
def test_fixed_size_trees_are_lossless(tiny, name):
    """With hardware.fixed_size_trees the same methods verify trees of one size per step, empty slots included;
    greedy output still equals the baseline's, and sampling runs through the same loop."""
    model = tiny(name)
    model.target.fixed_size_trees = True
    try:
        drafters = list(_drafters(model.target, STATIC_VARIANTS))
        assert all(d.fixed_size for _, d in drafters), [w for w, d in drafters if not d.fixed_size]
        for k in range(2):
            ids = _prompt_ids(model, k)
            base = generate(model.target, Autoregressive(model.target), ids, 32, model.stop_ids, record_gaps=True)
            for what, drafter in drafters:
                out = generate(model.target, drafter, ids, 32, model.stop_ids)
                assert_lossless(model, out, base, f"static {what} on prompt {k}")
                assert_fixed_sizes(drafter, out, what)
        for what, drafter in drafters:
            gen = torch.Generator().manual_seed(1)
            out = generate(model.target, drafter, _prompt_ids(model, 2), 24, model.stop_ids, SamplingConfig(0.9), gen)
            assert sum(out.accept_lengths) == out.step_tokens, what
    finally:
        model.target.fixed_size_trees = False


def test_pruned_fixed_size_trees_verify_fewer_slots_as_thresholds_rise(tiny):
    """hardware.fixed_size_trees: the pruned tree is verified at the size it kept (in buckets of 8), so its slots per step
    fall as its thresholds rise (0: no checkpoint fires, the dense 60; 1: the first fires, 8 kept); tokens stay AR's."""
    model = tiny("tiny_llama")
    model.target.fixed_size_trees = True
    try:
        ids = _prompt_ids(model, 0)
        base = generate(model.target, Autoregressive(model.target), ids, 32, model.stop_ids, record_gaps=True)
        slots = []
        for thresholds in ([0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]):
            drafter = make_drafter("pruned", model.target, thresholds=thresholds)
            out = generate(model.target, drafter, ids, 32, model.stop_ids)
            assert_lossless(model, out, base, f"pruned {thresholds}")
            assert_fixed_sizes(drafter, out, f"pruned {thresholds}")
            slots.append(sum(out.nodes) / out.steps)
    finally:
        model.target.fixed_size_trees = False
    assert slots[0] == 60 and slots[-1] == 8, slots
    assert slots == sorted(slots, reverse=True) and len(set(slots)) == 4, slots
