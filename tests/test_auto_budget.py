"""budget=auto: the tree size with the most expected tokens per millisecond."""

import pytest
import torch

from graft.methods.auto_budget import best_budget


def test_the_best_budget_maximises_expected_tokens_per_ms():
    probabilities = torch.tensor([0.05, 0.9, 0.1, 0.5])  # any order: the best are kept first
    costs = [30.0, 35.0, 40.0, 45.0, 50.0]  # N = 1..5 nodes
    # E(N) = 1, 1.9, 2.4, 2.5, 2.55 -> per ms .0333, .0543, .0600, .0556, .0510
    assert best_budget(probabilities, costs) == 3
    assert best_budget(probabilities, [30.0, 30.0, 30.0, 30.0, 30.0]) == 5  # free nodes: the whole budget
    assert best_budget(torch.tensor([0.01, 0.01]), [30.0, 60.0, 90.0]) == 1  # an unsure head: the root alone


def test_auto_needs_a_profile(tiny):
    from conftest import make_drafter
    from graft.schema import ConfigError

    with pytest.raises(ConfigError, match="method.cost_profile=nope.json: no such file"):
        make_drafter("eagle3_auto", tiny("tiny_llama").target, cost_profile="nope.json")


def _profile(tmp_path, verify_ms):
    """A cost profile of one context whose verify(N) for N = 1.. is `verify_ms`, with no loop overhead."""
    from graft.costmodel import CostProfile

    nodes = list(range(1, len(verify_ms) + 1))
    profile = CostProfile("cpu: test", "tiny", nodes, [0], [list(verify_ms)], [0.0] * len(nodes))
    path = tmp_path / "profile.json"
    profile.save(path)
    return str(path)


def test_most_per_ms_keeps_the_prefix_with_the_most_expected_tokens_per_ms():
    from graft.methods.auto_budget import most_per_ms

    # sums 1, 1.8, 2.3, 2.4 over 10, 11, 12, 20 ms -> .100, .164, .192, .120
    assert most_per_ms([1.0, 0.8, 0.5, 0.1], [10.0, 11.0, 12.0, 20.0]) == 3
    assert most_per_ms([1.0, 0.8, 0.5, 0.1], [10.0] * 4) == 4  # free nodes: all of them
    assert most_per_ms([1.0, 0.01], [10.0, 20.0]) == 1


def test_trim_auto_cuts_the_least_likely_nodes_and_keeps_the_tree_ancestor_closed(tmp_path):
    import math

    from graft.drafter import SequenceState
    from graft.methods.auto_budget import AutoTrim, TrimParams
    from graft.tree import DraftTree

    # root 0; draft chain 0 -> 1 (p .9) -> 2 (p .9 of that); draft 0 -> 3 (p .05); retrieved 0 -> 4 -> 5
    log = math.log
    tree = DraftTree(
        tokens=torch.tensor([10, 11, 12, 13, 14, 15]),
        parents=torch.tensor([-1, 0, 1, 0, 0, 4]),
        scores=torch.tensor([0.0, log(0.9), log(0.81), log(0.05), -math.inf, -math.inf]),
        sources=torch.tensor([0, 1, 1, 1, 2, 2], dtype=torch.int8),
    )
    trim = AutoTrim(TrimParams(cost_profile=_profile(tmp_path, [10.0, 10.5, 11.0, 11.5, 15.0, 20.0])))
    trim.start()
    values, places, parents = trim.values(tree)
    assert values[0] == 1.0 and values[2] <= values[1]  # a node never outvalues its parent
    assert values[5] <= values[4] == pytest.approx(0.5)  # a retrieved node's Beta(1, 1) prior: half its parent's
    cut = trim.cut(tree, SequenceState(tokens=[1, 2, 10], prompt_len=2))
    # a draft node: its parent's value x its bin's centre (.9 -> .95, .05 -> .05); retrieved: x 1/2. Values 1,
    # .95, .9025, .05, .5, .25: four nodes make 3.35 tokens in 11.5 ms (.291 a ms; three .259, five .240)
    assert cut.tokens.tolist() == [10, 11, 12, 14]
    assert cut.parents.tolist() == [-1, 0, 1, 0]
    assert cut.sources.tolist() == [0, 1, 1, 2]
    free = AutoTrim(TrimParams(cost_profile=_profile(tmp_path, [10.0] * 6)))
    free.start()
    assert free.cut(tree, SequenceState(tokens=[1, 2, 10], prompt_len=2)) is tree  # free nodes: nothing cut


def test_trim_auto_needs_a_profile():
    from graft.methods.auto_budget import AutoTrim, TrimParams
    from graft.schema import ConfigError

    with pytest.raises(ConfigError, match="trim auto needs method.cost_profile"):
        AutoTrim(TrimParams())
    with pytest.raises(ValueError, match="retrieval_prior"):
        TrimParams(retrieval_prior=[1.0, 0.0])
