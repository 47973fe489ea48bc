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
