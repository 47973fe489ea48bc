"""graft/reference.py, the Graft step written straight, is method=graft: the same tree (tokens and parents) at
every step and the same tokens, on a tiny model; with a setting changed it is not (the comparison can fail)."""

import dataclasses

import pytest
from conftest import make_drafter

from graft.data.loading import BUILTIN
from graft.decode import generate
from graft.reference import GraftSettings, generate_graft

MAX_NEW = 48


def graft_steps(model, ids):
    """method=graft through the decode loop -> (its tokens, each step's tree as (tokens, parents))."""
    drafter = make_drafter("graft", model.target)
    trees, propose = [], drafter.propose

    def recorded(state):
        proposal = propose(state)
        trees.append((proposal.tree.tokens.tolist(), proposal.tree.parents.tolist()))
        return proposal

    drafter.propose = recorded
    out = generate(model.target, drafter, ids, MAX_NEW, model.stop_ids)
    return out.new_tokens, trees, drafter.source.runner.head


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_llama:packed"])
def test_the_reference_step_builds_method_graft_trees_and_tokens(tiny, name):
    model = tiny(name)
    steps = 0
    for k in range(3):
        ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])
        tokens, trees, head = graft_steps(model, ids)
        mine, my_trees = generate_graft(model.target, head, ids, max_new_tokens=MAX_NEW, stop_ids=model.stop_ids)
        assert len(my_trees) == len(trees), f"prompt {k}"
        for step, (theirs, ours) in enumerate(zip(trees, my_trees)):
            assert ours == theirs, f"prompt {k}, step {step}"
        assert mine == tokens
        steps += len(trees)
    assert steps >= 3 * 10  # trees of many steps were compared, not a few


def test_the_comparison_fails_when_the_reference_prunes_otherwise(tiny):
    """Negative control: thresholds that never fire draft deeper trees than method=graft's from the first step."""
    model = tiny("tiny_llama")
    ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[0].turns[0]}])
    _, trees, head = graft_steps(model, ids)
    never = dataclasses.replace(GraftSettings(), thresholds=(0.0, 0.0, 0.0))
    _, my_trees = generate_graft(
        model.target, head, ids, max_new_tokens=MAX_NEW, stop_ids=model.stop_ids, settings=never
    )
    assert my_trees[0] != trees[0]


@pytest.mark.slow
def test_the_reference_step_is_method_graft_on_the_embedded_model_with_its_head():
    """The shipped EAGLE-3 head prunes at every checkpoint (8, 24 and 40 draft nodes) on these prompts."""
    from conftest import compose, method_yaml

    from graft.config.experiment import validate
    from graft.load.models import load_model
    from graft.registry import build_drafter, method_config

    cfg = validate(compose(["model=smollm2_135m", "logger=none"]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    for k in range(2):
        ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[k].turns[0]}])
        drafter = build_drafter(
            method_config(dict(method_yaml("graft")), draft_head=cfg.model.draft_head), model.target
        )
        trees, propose = [], drafter.propose
        drafter.propose = lambda state, trees=trees, propose=propose: trees.append(propose(state)) or trees[-1]
        out = generate(model.target, drafter, ids, 64, model.stop_ids)
        head = drafter.source.runner.head
        mine, my_trees = generate_graft(model.target, head, ids, max_new_tokens=64, stop_ids=model.stop_ids)
        assert my_trees == [(p.tree.tokens.tolist(), p.tree.parents.tolist()) for p in trees], f"prompt {k}"
        assert mine == out.new_tokens
