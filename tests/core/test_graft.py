"""Graft's parts on literal arrays: the successor table, template readout, grafting, stage selection,
the suffix automaton; then the drafters' trees on a tiny model."""

import math
import random

import pytest
import torch

from graft.fixed_size import compact, graft_fixed
from graft.grafting import graft
from graft.methods.pruned import scaled_split, stage_at
from graft.retrieval.recycling import DEFAULT_RANK_PRIOR, SuccessorTable, read_template
from graft.retrieval.suffix import SuffixAutomaton
from graft.tree import DraftTree, RankTree, topology

T = torch.tensor


def test_table_update_keeps_the_accepted_node_for_a_repeated_token():
    table = SuccessorTable(vocab_size=6, k=2)
    logits = T(
        [
            [0.0, 5.0, 4.0, 0.0, 0.0, 0.0],  # node 0, token 3, on the path: successors 1, 2
            [0.0, 0.0, 0.0, 2.0, 0.0, 9.0],  # node 1, token 1: successors 5, 3
            [7.0, 0.0, 0.0, 0.0, 6.0, 0.0],  # node 2, token 3 again, off the path: loses to node 0
            [0.0, 0.0, 1.0, 0.0, 3.0, 0.0],  # node 3, token 4: successors 4, 2
        ]
    )
    table.update(T([3, 1, 3, 4]), logits, T([True, False, False, False]))
    assert table.rows.tolist() == [[-1, -1], [5, 3], [-1, -1], [1, 2], [4, 2], [-1, -1]]
    # off the path both times: the node verified last wins
    table.update(T([2, 2]), logits[:2], T([False, False]))
    assert table.rows[2].tolist() == [5, 3]


def test_bigram_seeding_fills_only_empty_rows_latest_first():
    table = SuccessorTable(vocab_size=5, k=2)
    table.rows[4] = T([0, 1])
    table.seed_bigrams(T([1, 2, 1, 3, 4, 2]))
    assert table.rows.tolist() == [[-1, -1], [3, -1], [1, -1], [4, -1], [0, 1]]


def test_prefill_seeding_writes_each_prompt_tokens_successors_latest_first():
    """The paper's cold start: row t = the target's top-k after t's latest position in the prompt."""
    table = SuccessorTable(vocab_size=6, k=2)
    successors = T([[1, 2], [4, 0], [5, 4], [3, 1]])  # the prefill's top-2 after each prompt position
    table.seed_successors(T([3, 5, 3, 0]), successors)
    assert table.rows.tolist() == [[3, 1], [-1, -1], [-1, -1], [5, 4], [-1, -1], [4, 0]]


@pytest.mark.parametrize("chunk", [None, 5])
def test_prefill_successors_are_the_top_k_of_every_positions_logits(tiny, chunk):
    target = tiny("tiny_llama:packed").target
    prompt = list(range(30, 47))
    target.prefill_chunk = chunk
    target.reset(64)
    full = target.prefill(prompt, all_logits=True)
    target.reset(64)
    out = target.prefill(prompt, successors_k=3)
    assert out.successors.tolist() == full.logits.topk(3, dim=-1).indices.tolist()
    torch.testing.assert_close(out.logits, full.logits[-1:])  # the last position's logits only


def test_graft_with_the_prefill_cold_start_is_lossless(tiny):
    from conftest import make_drafter

    from baselines.autoregressive import Autoregressive
    from graft.decode import generate

    target = tiny("tiny_llama:packed").target
    prompt = [5, 9, 5, 12, 40, 41, 42, 5, 9, 7]
    base = generate(target, Autoregressive(target), prompt, 32, set())
    drafter = make_drafter("graft", target, total_tokens=12, cold_start="prefill")
    assert drafter.needs.prompt_successors == 8  # the table's k
    out = generate(target, drafter, prompt, 32, set())
    assert out.new_tokens == base.new_tokens


def test_template_readout_from_a_given_table():
    table = SuccessorTable(vocab_size=6, k=2)
    table.rows.copy_(T([[1, 2], [3, 4], [5, -1], [0, 1], [-1, -1], [2, 0]]))
    #         anchor  r0 of 0  r1 of 0  r0 of 1  r1 of 1  r0 of 2  r0 of 3
    template = RankTree.make([-1, 0, 0, 1, 1, 2, 3], [0, 0, 1, 0, 1, 0, 0])
    assert read_template(table, template, 0).tolist() == [0, 1, 2, 3, 4, 5, 0]
    assert read_template(table, template, 2).tolist() == [2, 5, -1, 2, 0, -1, 5]  # unknown propagates


def test_templates_are_best_first_and_unbalanced():
    template = RankTree.best_first(60, DEFAULT_RANK_PRIOR, max_depth=8)
    parents, ranks = template.parents.tolist(), template.ranks.tolist()
    assert len(parents) == 60 and parents[0] == -1
    assert all(0 <= parents[i] < i for i in range(1, 60))
    depth = [0] * 60
    for i in range(1, 60):
        depth[i] = depth[parents[i]] + 1
    deepest = depth.index(max(depth))
    node = deepest
    while node > 0:  # the deepest node hangs from the rank-0 chain
        assert ranks[node] == 0
        node = parents[node]
    assert max(depth) >= 5
    assert depth[[i for i in range(1, 60) if ranks[i] != 0][0]] <= 2
    children = lambda node: sum(1 for i in range(1, 60) if parents[i] == node)  # noqa: E731
    root_kids = [i for i in range(1, 60) if parents[i] == 0]
    assert [ranks[i] for i in root_kids] == list(range(len(root_kids)))
    assert children(root_kids[0]) >= children(root_kids[1]) >= children(root_kids[-1])
    assert (
        RankTree.best_first(20, DEFAULT_RANK_PRIOR, max_depth=8).parents.tolist() == parents[:20]
    )  # a smaller budget is a prefix


def _tree(tokens, parents, sources=None):
    sources = T(sources, dtype=torch.int8) if sources is not None else None
    return DraftTree(T(tokens), T(parents), scores=torch.zeros(len(tokens)), sources=sources)


def test_graft_merges_duplicates_and_spends_the_freed_slots():
    draft = _tree([10, 11, 12, 13], [-1, 0, 0, 1], [0, 1, 1, 1])  # root 10 -> 11 -> 13, root -> 12
    # retrieved under the root: 11 (dup) -> 13 (dup) -> 30 ; 11 -> 31 ; 20 ; 12 (dup) -> 32 ; -1 (unknown) -> 33
    tokens = T([10, 11, 20, 13, 31, 12, -1, 30, 32, 33])
    parents = T([-1, 0, 0, 1, 1, 0, 0, 3, 5, 6])
    out = graft(draft, 0, tokens, parents, room=3)
    assert out.tree.tokens.tolist() == [10, 11, 12, 13, 20, 31, 30]
    assert out.tree.parents.tolist() == [-1, 0, 0, 1, 0, 1, 3]
    assert out.tree.sources.tolist() == [0, 1, 1, 1, 2, 2, 2]
    assert (out.added, out.merged) == (3, 3)
    mask = topology(out.tree.parents, cache_len=0).ancestors.int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 0, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 0, 1],
    ]
    # with more room the next template node (32 under the draft's 12) comes in; the unknown branch never does
    wide = graft(draft, 0, tokens, parents, room=10)
    assert wide.tree.tokens.tolist() == [10, 11, 12, 13, 20, 31, 30, 32]
    assert wide.tree.parents.tolist() == [-1, 0, 0, 1, 0, 1, 3, 2]


def test_graft_under_a_leaf_anchor():
    draft = _tree([10, 11, 13], [-1, 0, 1], [0, 1, 1])
    out = graft(draft, 2, T([13, 40, 41]), T([-1, 0, 1]), room=2)
    assert out.tree.tokens.tolist() == [10, 11, 13, 40, 41]
    assert out.tree.parents.tolist() == [-1, 0, 1, 2, 3]


def test_the_fixed_size_graft_fills_the_same_nodes_in_fixed_slots():
    """graft_fixed on the literal case above: the same retrieved nodes in the same order, the slots no
    node took left empty (-1, parent 0, EMPTY), counts as tensors; compact() moves the filled nodes first and
    cuts the tree to the budget, giving graft()'s tree plus empty slots."""
    draft = _tree([10, 11, 12, 13, -1], [-1, 0, 0, 1, 0], [0, 1, 1, 1, 4])  # an empty slot in the draft too
    tokens = T([10, 11, 20, 13, 31, 12, -1, 30, 32, 33])
    parents = T([-1, 0, 0, 1, 1, 0, 0, 3, 5, 6])
    out = graft_fixed(draft, 0, tokens, parents, room=T(3))
    assert out.tree.num_nodes == 5 + 9
    assert out.tree.tokens.tolist() == [10, 11, 12, 13, -1, 20, 31, 30] + [-1] * 6
    assert out.tree.parents.tolist() == [-1, 0, 0, 1, 0, 0, 1, 3] + [0] * 6
    assert out.tree.sources.tolist() == [0, 1, 1, 1, 4, 2, 2, 2] + [4] * 6
    assert (int(out.added), int(out.merged)) == (3, 3)
    packed = compact(out.tree, 8)
    assert packed.tokens.tolist() == [10, 11, 12, 13, 20, 31, 30, -1]
    assert packed.parents.tolist() == [-1, 0, 0, 1, 0, 1, 3, 0]
    reference = graft(_tree([10, 11, 12, 13], [-1, 0, 0, 1], [0, 1, 1, 1]), 0, tokens, parents, room=3)
    assert packed.tokens[:7].tolist() == reference.tree.tokens.tolist()
    assert packed.parents[:7].tolist() == reference.tree.parents.tolist()
    # under a leaf anchor, with room for everything
    leaf = graft_fixed(_tree([10, 11, 13], [-1, 0, 1], [0, 1, 1]), 2, T([13, 40, 41]), T([-1, 0, 1]), room=T(5))
    assert leaf.tree.tokens.tolist() == [10, 11, 13, 40, 41]
    assert leaf.tree.parents.tolist() == [-1, 0, 1, 2, 3]


def test_the_fixed_size_graft_agrees_with_graft_on_random_trees():
    """Random drafts and subtrees (duplicates, unknown tokens, any anchor and room): graft_fixed + compact
    keeps exactly graft()'s nodes."""
    rng = random.Random(0)
    for _ in range(200):
        n, m = rng.randint(1, 9), rng.randint(2, 12)
        d_tokens = [rng.randrange(4)] + [rng.randrange(4) for _ in range(n - 1)]
        d_parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        anchor = rng.randrange(n)
        r_tokens = [d_tokens[anchor]] + [rng.choice([-1, 0, 1, 2, 3, 3]) for _ in range(m - 1)]
        r_parents = [-1] + [rng.randrange(i) for i in range(1, m)]
        room = rng.randint(0, m)
        draft = _tree(d_tokens, d_parents, [0] + [1] * (n - 1))
        want = graft(draft, anchor, T(r_tokens), T(r_parents), room)
        got = compact(graft_fixed(draft, anchor, T(r_tokens), T(r_parents), T(room)).tree, want.tree.num_nodes)
        assert got.tokens.tolist() == want.tree.tokens.tolist(), (
            d_tokens,
            d_parents,
            anchor,
            r_tokens,
            r_parents,
            room,
        )
        assert got.parents.tolist() == want.tree.parents.tolist()


def test_the_fixed_size_selection_keeps_what_the_pruned_selection_keeps():
    """select_fixed fills exactly select()'s nodes (same tokens, same parents) and leaves the rest of the
    fixed size empty; a level cap drops the candidates the host path would not have drafted."""
    from graft.fixed_size import select_fixed
    from graft.tree import Candidates, select

    k = 2
    found = Candidates(
        tokens=[T([5, 6]), T([7, 8, 9, 10])],
        scores=[T([-0.1, -0.9]), T([-0.3, -2.0, -1.0, -1.5])],
        group_parent=[T([0]), T([1, 2])],
        top_k=k,
        levels=1,
    )
    for keep in range(0, 6):
        host = select(found, 1, keep)
        fixed = select_fixed(found, T([1]), T(keep), 5, None)
        assert fixed.num_nodes == 6
        filled = fixed.tokens >= 0
        assert fixed.tokens[filled].tolist() == host.tokens.tolist()
        assert compact(fixed, host.num_nodes).parents.tolist() == host.parents.tolist()
    capped = select_fixed(found, T([1]), T(3), 5, level_cap=T(0))  # only the root's children count
    assert capped.tokens.tolist() == [1, 5, 6, -1, -1, -1]


def test_stage_selection_for_given_confidences():
    checks, thresholds = [0, 1, 5], [0.35, 0.25, 0.15]
    assert stage_at(0, T([math.log(0.30), math.log(0.2)]), checks, thresholds) == 0
    assert stage_at(0, T([math.log(0.40)]), checks, thresholds) is None
    assert stage_at(1, [math.log(0.24)], checks, thresholds) == 1
    assert stage_at(1, [math.log(0.26)], checks, thresholds) is None
    assert stage_at(3, [math.log(0.01)], checks, thresholds) is None  # not a checkpoint
    assert stage_at(5, [math.log(0.10)], checks, thresholds) == 2
    assert [scaled_split(n, 60, 60) for n in (8, 24, 40)] == [8, 24, 40]
    assert [scaled_split(n, 8, 60) for n in (8, 24, 40)] == [2, 3, 5]
    assert [scaled_split(n, 16, 60) for n in (8, 24, 40)] == [2, 6, 11]
    assert [scaled_split(n, 1, 60) for n in (8, 24, 40)] == [1, 1, 1]  # the budget caps root + 1


BUDGETED = [
    "recycling", "samd", "eagle3", "eagle3_chain", "eagle3_auto", "pruned", "graft", "graft_root",
    "graft_noprune", "graft_tail", "graft_refill", "graft_auto", "dflash", "dflash_graft", "dflash_tree",
]  # fmt: skip


@pytest.mark.parametrize("budget", [2, 3])  # 1, the root alone, is AR: a composed method refuses it
def test_every_method_verifies_at_most_its_budget(tiny, budget):
    from conftest import make_drafter, method_yaml

    from graft.decode import generate

    target = tiny("tiny_llama").target
    assert {m for m in BUDGETED if "total_tokens" not in dict(method_yaml(m))} == set()
    for method in BUDGETED:
        out = generate(target, make_drafter(method, target, total_tokens=budget), list(range(5, 40)), 12, set())
        assert max(out.nodes) <= budget, (method, out.nodes)


def _brute_match(text):
    end = len(text) - 1
    for length in range(end, 0, -1):
        suffix = text[end - length + 1 :]
        for start in range(0, end - length + 1):
            if text[start : start + length] == suffix:
                return length, start + length
    return 0, -1


def test_suffix_automaton_on_hand_made_sequences():
    sam = SuffixAutomaton()
    sam.extend([1, 2, 3, 4, 1, 2])
    assert sam.longest_earlier_match() == (2, 2)  # "1 2" occurred at 0..1, continued with 3
    assert sam.continuation(3) == (2, [3, 4, 1])
    sam.extend([3])
    assert sam.continuation(2) == (3, [4, 1])
    sam = SuffixAutomaton()
    sam.extend([5, 6, 7])
    assert sam.longest_earlier_match() == (0, -1)
    assert sam.continuation(4) == (0, [])
    sam.extend([6])
    assert sam.continuation(4, min_match=2) == (1, [])
    assert sam.continuation(4) == (1, [7, 6])
    sam = SuffixAutomaton()
    sam.extend([9, 9, 9, 9])  # overlapping occurrences: the longest earlier one is 9 9 9 ending at 2
    assert sam.continuation(5) == (3, [9])


def test_suffix_automaton_agrees_with_brute_force():
    rng = random.Random(0)
    for _ in range(30):
        sam = SuffixAutomaton()
        text = []
        for _ in range(rng.randint(1, 60)):
            token = rng.randint(0, 3)
            text.append(token)
            sam.extend([token])
            length, start = sam.longest_earlier_match()
            want_length, _ = _brute_match(text)
            assert length == want_length, text
            if length:
                assert text[start - length : start] == text[len(text) - length :]


@pytest.mark.parametrize("budget", [8, 16, 60])
def test_graft_trees_fit_the_budget_and_keep_the_pruned_draft(tiny, budget):
    from conftest import make_drafter

    from graft.data.loading import BUILTIN
    from graft.decode import generate

    model = tiny("tiny_llama")
    ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[2].turns[0]}])
    runs = {}
    for name in ("pruned", "graft"):
        drafter = make_drafter(name, model.target, total_tokens=budget)
        runs[name] = generate(model.target, drafter, ids, 48, model.stop_ids)
    pruned, grafted = runs["pruned"], runs["graft"]
    assert grafted.new_tokens == pruned.new_tokens
    assert max(grafted.nodes) <= budget
    assert grafted.tau >= pruned.tau
    info = grafted.step_info
    assert len(info) == grafted.steps and all(
        i["draft_nodes"] + i["retrieved_nodes"] + 1 == n for i, n in zip(info, grafted.nodes)
    )
    assert sum(s[3] for s in grafted.step_sources) > 0  # retrieved tokens were accepted
    assert all(s[1] == 0 for s in pruned.step_sources)


def test_refill_spends_what_retrieval_left_on_the_next_best_draft_candidates():
    from graft.compose import ComposedDrafter
    from graft.grafting import Grafted
    from graft.parts import Draft

    # candidates in candidate (topological) order: root 10's children 11 (-0.5), 12 (-1.0), 14 (-1.6); 11's child 13 (-0.9)
    cand_tokens, cand_parents, cand_scores = [11, 12, 14, 13], [0, 0, 0, 1], [-0.5, -1.0, -1.6, -0.9]

    def widen(n):  # the best n candidates, kept in candidate order (ancestor-closed: scores fall along a path)
        best = sorted(sorted(range(4), key=lambda i: -cand_scores[i])[:n])
        place = {c: j + 1 for j, c in enumerate(best)}
        parents = [-1] + [0 if cand_parents[c] == 0 else place[cand_parents[c] - 1] for c in best]
        return DraftTree(
            tokens=T([10] + [cand_tokens[c] for c in best]),
            parents=T(parents),
            scores=T([0.0] + [cand_scores[c] for c in best]),
        )

    draft = Draft(_tree([10, 11], [-1, 0], [0, 1]), "check@0", widen)  # the split kept the best child only
    grafted = Grafted(draft.tree, room=3)
    grafted.add_subtree(0, T([10, 12, 20]), T([-1, 0, 1]))  # retrieval: 12 -> 20 under the root
    assert (grafted.added, grafted.room) == (2, 1)
    refilled = ComposedDrafter._refill(draft, grafted)
    # widen(1 + 1) = 11, 13 (13 is better than 12): 11 merges, 13 fills the last slot under 11
    assert refilled == 1 and grafted.room == 0 and grafted.added == 2
    assert grafted.tree.tokens.tolist() == [10, 11, 12, 20, 13]
    assert grafted.tree.parents.tolist() == [-1, 0, 0, 2, 1]
    assert grafted.tree.sources.tolist() == [0, 1, 2, 2, 1]
    assert grafted.tree.scores[4].item() == pytest.approx(-0.9)
    # with more room every candidate is offered, in candidate order; 12, already retrieved, merges and takes no slot
    grafted = Grafted(draft.tree, room=5)
    grafted.add_subtree(0, T([10, 12]), T([-1, 0]))
    assert ComposedDrafter._refill(draft, grafted) == 2
    assert grafted.tree.tokens.tolist() == [10, 11, 12, 14, 13] and grafted.room == 2
    assert grafted.tree.parents.tolist() == [-1, 0, 0, 0, 1]


def test_refill_fills_the_budget_and_keeps_the_tokens(tiny):
    from conftest import make_drafter

    from graft.data.loading import BUILTIN
    from graft.decode import generate

    model = tiny("tiny_llama")
    ids = model.chat.prompt_ids([{"role": "user", "content": BUILTIN[2].turns[0]}])
    runs = {
        name: generate(model.target, make_drafter(name, model.target, total_tokens=8), ids, 48, model.stop_ids)
        for name in ("graft", "graft_refill")
    }
    plain, refilled = runs["graft"], runs["graft_refill"]
    assert refilled.new_tokens == plain.new_tokens
    assert max(refilled.nodes) <= 8 and sum(refilled.nodes) / refilled.steps > sum(plain.nodes) / plain.steps
    assert all(
        i["draft_nodes"] + i["retrieved_nodes"] + i["refilled_nodes"] + 1 == n
        for i, n in zip(refilled.step_info, refilled.nodes)
    )
    assert sum(i["refilled_nodes"] for i in refilled.step_info) > 0


def test_refill_without_a_draft_source_is_refused_with_the_reason():
    from conftest import make_drafter

    from graft.schema import ConfigError

    with pytest.raises(ConfigError, match="method.refill=true .* needs a draft source"):
        make_drafter("recycling", None, refill=True)
