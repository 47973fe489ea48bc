"""What each method proposes for a given sequence, on literal arrays (in the style of vLLM's test_ngram):
prompt lookup, suffix retrieval, Token Recycling's table and template, SAM-Decoding's switch, and the
pruned selection after a given checkpoint stage."""

import math

import torch
from conftest import make_drafter

from graft.acceptance import Acceptance
from graft.backends.target import ForwardOutput
from graft.drafter import PrefillInfo, SequenceState, StepFeedback
from graft.methods.pruned import StageParams, StageSplit
from graft.ops import Ops
from graft.tree import Candidates, NodeSource, select, topology

T = torch.tensor
R, D, RET = int(NodeSource.ROOT), int(NodeSource.DRAFT), int(NodeSource.RETRIEVAL)


class StubTarget:
    """What a retrieval-only drafter sees of the target."""

    device = torch.device("cpu")
    vocab_size = 10
    fixed_size_trees = False
    ops = Ops()

    def check_taps(self, taps):
        assert taps == ()


def _start(drafter, prompt: list[int], first: int, prefill_logits=None) -> SequenceState:
    state = SequenceState(tokens=[*prompt, first], prompt_len=len(prompt))
    logits = prefill_logits if prefill_logits is not None else torch.zeros(1, StubTarget.vocab_size)
    drafter.reset(PrefillInfo(state=state, forward=ForwardOutput(logits=logits, hidden=None)))
    return state


def _tree(proposal):
    tree = proposal.tree
    return tree.tokens.tolist(), tree.parents.tolist(), tree.sources.tolist()


def test_pld_continues_the_latest_match_of_the_longest_ngram():
    drafter = make_drafter("pld", StubTarget(), num_pred_tokens=3)
    # last 3-gram (4 1 2) never occurred before; the 2-gram (1 2) ended at position 1, then 3 4 1 followed
    state = _start(drafter, [1, 2, 3, 4, 1], 2)
    assert _tree(drafter.propose(state)) == ([2, 3, 4, 1], [-1, 0, 1, 2], [R, RET, RET, RET])
    # the latest occurrence wins: 5 1 ... 1 2 9 ... 1 2 -> after the second "1 2" came 7
    state = _start(drafter, [1, 2, 9, 1, 2, 7, 1], 2)
    assert _tree(drafter.propose(state))[0] == [2, 7, 1, 2]
    # no earlier occurrence of even the last token: the root alone
    state = _start(drafter, [1, 2, 3], 4)
    assert _tree(drafter.propose(state)) == ([4], [-1], [R])


def test_pld_respects_min_ngram_and_the_budget():
    drafter = make_drafter("pld", StubTarget(), min_ngram=2, num_pred_tokens=5, total_tokens=3)
    state = _start(drafter, [7, 1, 2, 3, 8], 7)  # only a 1-gram (7) matches: below min_ngram
    assert _tree(drafter.propose(state))[0] == [7]
    state = _start(drafter, [5, 6, 1, 2, 3, 4, 5], 6)  # 5 6 matched; 1 2 3 4 followed, the budget keeps 2
    assert _tree(drafter.propose(state))[0] == [6, 1, 2]


def test_suffix_retrieval_follows_the_longest_earlier_match():
    drafter = make_drafter("suffix", StubTarget(), suffix_tokens=4)
    state = _start(drafter, [1, 2, 3, 4, 9, 2, 3], 4)  # suffix "2 3 4" occurred at 1..3, then 9 2 3 4
    proposal = drafter.propose(state)
    assert _tree(proposal) == ([4, 9, 2, 3, 4], [-1, 0, 1, 2, 3], [R, RET, RET, RET, RET])
    assert proposal.note.match == 3 and proposal.note.retrieved_nodes == 4
    drafter = make_drafter("suffix", StubTarget(), suffix_min_match=4)
    state = _start(drafter, [1, 2, 3, 4, 9, 2, 3], 4)  # the 3-token match is too short
    assert _tree(drafter.propose(state))[0] == [4]


def test_recycling_reads_its_template_from_the_table_and_refreshes_it():
    drafter = make_drafter(
        "recycling", StubTarget(), table_k=2, template_depth=2, total_tokens=5, rank_prior=[0.4, 0.14]
    )
    # template (best first, 5 nodes): root -> r0 (a) -> r0 of a; root -> r1 (b); a -> r1 of a
    prefill = torch.zeros(1, 10)
    prefill[0, 6], prefill[0, 2] = 2.0, 1.0  # after the last prompt token (1): 6, then 2
    state = _start(drafter, [4, 6, 4, 7, 1], 4, prefill)
    # bigrams of the prompt: 4 -> 7 (latest), 6 -> 4, 7 -> 1; the prefill: 1 -> 6, 2
    # at root 4: r0 = 7, r0 of 7 = 1; r1 of 4 and of 7 unknown (-1): dropped
    assert _tree(drafter.propose(state)) == ([4, 7, 1], [-1, 0, 1], [R, RET, RET])
    # verify [4, 7, 1]; the target accepts 7; every node's row is rewritten from its own logits
    logits = torch.zeros(3, 10)
    logits[0, [7, 3]] = T([2.0, 1.0])  # after 4: 7, 3
    logits[1, [5, 8]] = T([2.0, 1.0])  # after 7: 5, 8 (the bonus token is 5)
    logits[2, [9, 0]] = T([2.0, 1.0])  # after 1: 9, 0
    proposal = drafter.propose(state)
    state.tokens += [7, 5]
    acceptance = Acceptance(path=[0, 1], tokens=[7, 5], path_index=T([0, 1]))
    step = StepFeedback(proposal, topology(proposal.tree.parents, 6), ForwardOutput(logits, None), acceptance, state)
    drafter.update(step)
    table = drafter.retrievers[0].recycler.table.rows
    assert table[[4, 7, 1]].tolist() == [[7, 3], [5, 8], [9, 0]]
    # at root 5 nothing is known yet; at root 7 the refreshed rows give 7 -> 5 (-> unknown), 8
    assert _tree(drafter.propose(state))[0] == [5]
    state.tokens.append(7)
    assert _tree(drafter.propose(state)) == ([7, 5, 8], [-1, 0, 0], [R, RET, RET])


def test_samd_switches_between_the_suffix_match_and_the_draft_tree(tiny):
    model = tiny("tiny_llama")
    samd = make_drafter("samd", model.target, total_tokens=8)
    eagle = make_drafter("eagle3", model.target, total_tokens=8)

    def propose(drafter, prompt):
        model.target.reset(64)
        prefill = model.target.prefill(prompt[:-1], drafter.needs.taps)
        state = SequenceState(
            tokens=prompt, prompt_len=len(prompt) - 1
        )  # the last token stands for the first generated one
        drafter.reset(PrefillInfo(state=state, forward=prefill))
        return drafter.propose(state)

    repeated = [10, 11, 12, 13, 14, 15, 16, 17, 30, 10, 11, 12, 13, 14]  # "10 .. 14" (5 tokens) occurred before
    out = propose(samd, repeated)
    assert _tree(out) == ([14, 15, 16, 17, 30, 10, 11, 12], [-1, 0, 1, 2, 3, 4, 5, 6], [R] + [RET] * 7)
    assert (out.note.stage, out.note.match) == ("retrieval", 5)
    short = [10, 11, 12, 13, 30, 10, 11, 12, 13]  # a 4-token match: below min_match 5, so the EAGLE-3 tree
    out = propose(samd, short)
    assert out.note.stage == "draft" and out.note.match == 4
    assert _tree(out) == _tree(propose(eagle, short))


def test_pruned_selection_after_the_stage_that_fires():
    log = math.log
    # top_k 2: the root's children 10 (0.5), 11 (0.3); one level: 10 -> 20 (0.2), 21 (0.1); 11 -> 22 (0.06), 23 (0.05)
    found = Candidates(
        tokens=[T([10, 11]), T([20, 21, 22, 23])],
        scores=[T([log(0.5), log(0.3)]), T([log(0.2), log(0.1), log(0.06), log(0.05)])],
        group_parent=[T([0]), T([1, 2])],
        top_k=2,
        levels=1,
    )
    split = StageSplit(StageParams())  # checkpoints after 0, 1, 5 levels; thresholds 0.35, 0.25, 0.15
    split.start()
    assert split.stop_after(0, found.scores[0]) is False  # 0.5 >= 0.35: drafting goes on
    assert split.stop_after(1, T([log(0.2), log(0.1)])) is True  # 0.2 < 0.25: stage 1 fires
    assert split.label() == "check@1"
    keep = split.keep(torch.cat(found.scores), total_tokens=10)  # 24 of 60 scaled to 10: 4, root included
    assert keep == 4
    tree = select(found, root=7, keep=keep - 1)
    assert (tree.tokens.tolist(), tree.parents.tolist(), tree.sources.tolist()) == (
        [7, 10, 11, 20],
        [-1, 0, 0, 1],
        [R, D, D, D],
    )
    # with prune: false the stage is recorded but drafting continues, and the split is the same
    split = StageSplit(StageParams(prune=False))
    split.start()
    assert split.stop_after(0, T([log(0.3)])) is False and split.label() == "check@0"
    assert split.keep(torch.cat(found.scores), total_tokens=60) == 8
