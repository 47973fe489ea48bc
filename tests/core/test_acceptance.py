import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from graft.acceptance import accept_greedy, accept_sampling, accept_sampling_on_device, target_distribution
from graft.tree import DraftTree, topology

PARENTS = [-1, 0, 0, 1, 1, 2]


def _logits_with_argmax(argmaxes, vocab=10):
    logits = torch.zeros(len(argmaxes), vocab)
    for row, token in enumerate(argmaxes):
        logits[row, token] = 5.0
    return logits


def test_greedy_takes_the_longest_correct_path_and_the_bonus():
    tree = DraftTree(tokens=torch.tensor([1, 5, 7, 6, 9, 8]), parents=torch.tensor(PARENTS))
    attn = topology(tree.parents, 0)
    # target: after root 7 (node 2 right, node 1 wrong); after node 2 -> 8 (node 5 right); after node 5 -> 3
    logits = _logits_with_argmax([7, 0, 8, 0, 0, 3])
    acc = accept_greedy(tree, attn, logits)
    assert acc.path == [0, 2, 5]
    assert acc.tokens == [7, 8, 3]
    assert acc.num_accepted == 2


def test_greedy_rejects_a_correct_token_under_a_wrong_parent():
    tree = DraftTree(tokens=torch.tensor([1, 5, 7, 6, 9, 8]), parents=torch.tensor(PARENTS))
    attn = topology(tree.parents, 0)
    # node 3 (token 6) matches the argmax after node 1, but node 1 itself is wrong
    logits = _logits_with_argmax([4, 6, 0, 0, 0, 0])
    acc = accept_greedy(tree, attn, logits)
    assert acc.path == [0] and acc.tokens == [4]


def test_greedy_root_only_is_plain_argmax():
    tree = DraftTree.root_only(3)
    acc = accept_greedy(tree, topology(tree.parents, 4), _logits_with_argmax([9]))
    assert acc.path == [0] and acc.tokens == [9]


# --- sampling: the committed tokens must follow the target's own distribution --------------------

VOCAB = 5
_rng = np.random.default_rng(0)
MARKOV_LOGITS = torch.tensor(np.log(_rng.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)), dtype=torch.float32)


def _tree_for(root: int) -> DraftTree:
    """A fixed, unbalanced tree: the two most likely next tokens, with duplicates and a deep branch."""
    order = torch.argsort(MARKOV_LOGITS[root], descending=True).tolist()
    a, b, c = order[0], order[1], order[2]
    tokens = [root, a, b, a, b, c, a]
    parents = [-1, 0, 0, 0, 1, 1, 4]  # node 3 duplicates node 1's token under the same parent
    return DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))


def _logits_for(tree: DraftTree) -> torch.Tensor:
    return MARKOV_LOGITS[tree.tokens]  # a Markov target: next-token logits depend on the node's own token


def _accept(where, tree, logits, temperature, top_p, gen, renormalize):
    if where == "host":
        return accept_sampling(tree, logits, temperature, top_p, gen, renormalize=renormalize)
    attn = topology(tree.parents, 0)
    return accept_sampling_on_device(tree, attn, logits, temperature, top_p, gen, renormalize=renormalize)


def _draw_two_tokens(gen, temperature, top_p, renormalize, where="host"):
    committed = []
    root = 0
    while len(committed) < 2:
        tree = _tree_for(root)
        acc = _accept(where, tree, _logits_for(tree), temperature, top_p, gen, renormalize)
        committed += acc.tokens
        root = committed[-1]
    return committed[0] * VOCAB + committed[1]


def _expected_two_tokens(temperature, top_p):
    p = target_distribution(MARKOV_LOGITS, temperature, top_p).double()
    first = p[0]
    return (first[:, None] * p).reshape(-1).numpy()


def _chi2_pvalue(temperature, top_p, renormalize, draws=2000, where="host"):  # broken rule: p < 1e-30
    gen = torch.Generator().manual_seed(1234)
    counts = np.bincount(
        [_draw_two_tokens(gen, temperature, top_p, renormalize, where) for _ in range(draws)], minlength=VOCAB * VOCAB
    )
    expected = _expected_two_tokens(temperature, top_p) * draws
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token outside the target's support"
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    return chisquare(counts[keep], expected).pvalue


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_tree_sampling_matches_the_target_distribution(temperature, top_p, where):
    """The host walk and the device form (every draw at once, one read) both commit the target's own samples."""
    assert _chi2_pvalue(temperature, top_p, renormalize=True, where=where) > 1e-3


@pytest.mark.parametrize("where", ["host", "device"])
def test_the_check_fails_on_a_broken_acceptance_rule(where):
    assert _chi2_pvalue(1.0, 1.0, renormalize=False, where=where) < 1e-6


def test_device_sampling_keeps_an_accepted_path_and_skips_empty_slots():
    """Literal case: the root's children are token 2 (p = 1 after the root) and an empty slot; the walk must take
    node 1 and then draw the bonus from node 1's row (all mass on token 4)."""
    tree = DraftTree(tokens=torch.tensor([0, -1, 2]), parents=torch.tensor([-1, 0, 0]))
    logits = torch.full((3, 5), -1e9)
    logits[0, 2] = 0.0  # after the root: token 2 surely
    logits[2, 4] = 0.0  # after node 2: token 4 surely
    logits[1, 1] = 0.0
    acc = accept_sampling_on_device(tree, topology(tree.parents, 0), logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert acc.path == [0, 2] and acc.tokens == [2, 4] and acc.path_index.tolist() == [0, 2]


def test_the_float_tie_rule_is_four_ulps_in_bfloat16_and_sixteen_in_float32():
    from graft.run.lossless import float_tie

    # bfloat16 near 20: one ulp is 2**4 * 2**-7 = 0.125, four are 0.5
    assert float_tie(0.5, 20.0, torch.bfloat16)
    assert not float_tie(0.625, 20.0, torch.bfloat16)
    assert not float_tie(2.0, 20.0, torch.bfloat16)  # the old 16-ulp rule would have excused this
    # float32 near 20: one ulp is 2**4 * 2**-23 = 1.9e-6; 16 of them are 3.05e-5
    assert float_tie(3.0e-5, 20.0, torch.float32)
    assert not float_tie(3.1e-5, 20.0, torch.float32)
    assert not float_tie(0.5, 20.0, torch.bfloat16, ulps=2)  # an explicit run.float_tie_ulps wins


def _random_tree(generator, n: int, vocab: int) -> DraftTree:
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, n)]
    return DraftTree(tokens=torch.randint(0, vocab, (n,), generator=generator), parents=torch.tensor(parents))


def test_the_host_walk_accepts_what_the_device_path_accepts():
    """The CPU's host walk against the device path's tensor code, on random trees whose tokens often match
    (a 3-token vocabulary) and on equally deep correct paths (the lowest node index wins in both)."""
    from graft.ops import Ops

    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(2, 20, (1,), generator=g))
        tree = _random_tree(g, n, 3)
        logits = torch.randn(n, 3, generator=g)
        attn = topology(tree.parents, 7)
        host = accept_greedy(tree, attn, logits, Ops(host_paths=True))
        device = accept_greedy(tree, attn, logits, Ops(host_paths=False))
        assert (host.path, host.tokens) == (device.path, device.tokens), trial
        assert host.path_index is None and host.index == device.path_index.tolist()
        assert host.tokens == device.token_ids.tolist()
    # two correct paths of depth 2: nodes 3 and 4 both end one; node 3 (the lower index) is kept
    tree = DraftTree(tokens=torch.tensor([0, 1, 1, 2, 2]), parents=torch.tensor([-1, 0, 0, 1, 2]))
    acc = accept_greedy(tree, topology(tree.parents, 0), _logits_with_argmax([1, 2, 2, 0, 0]))
    assert acc.path == [0, 1, 3] and acc.tokens == [1, 2, 0]


def test_one_call_accepts_a_batch_of_trees_as_each_tree_alone():
    """graft.acceptance.accept over several trees (greedy: one argmax over a ragged forward's adjacent logits
    blocks, or per block; sampling: each tree's own generator) decides what accept_greedy / accept_sampling
    decide for each tree alone, on the host and on the device path."""
    from graft.acceptance import accept, accept_sampling
    from graft.ops import Ops

    g = torch.Generator().manual_seed(1)
    trees = [_random_tree(g, int(torch.randint(1, 12, (1,), generator=g)), 3) for _ in range(9)]
    topos = [topology(t.parents, 5) for t in trees]
    joined = torch.randn(sum(t.num_nodes for t in trees), 3, generator=g)
    blocks = list(joined.split([t.num_nodes for t in trees]))  # adjacent views, as forward_segments gives
    apart = [block.clone() for block in blocks]
    alone = [accept_greedy(t, a, rows) for t, a, rows in zip(trees, topos, apart)]
    for logits in (blocks, apart):
        for ops in (Ops(host_paths=True), Ops(host_paths=False)):
            batch = accept(trees, topos, logits, ops=ops)
            assert [(a.path, a.tokens) for a in batch] == [(a.path, a.tokens) for a in alone]
    drawn = accept(
        trees, topos, apart, temperature=0.8, generators=[torch.Generator().manual_seed(i) for i in range(9)]
    )
    each = [
        accept_sampling(t, rows, 0.8, 1.0, torch.Generator().manual_seed(i))
        for i, (t, rows) in enumerate(zip(trees, apart))
    ]
    assert [(a.path, a.tokens) for a in drawn] == [(a.path, a.tokens) for a in each]
