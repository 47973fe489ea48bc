"""A batch drafts every slot's EAGLE tree at once (graft/methods/eagle_tree.py): one expansion over [slots, k]
tensors and one selection over [slots, candidates], each slot getting the candidates and tree it gets alone."""

import pytest
import torch

from graft.draft_models.eagle.checkpoint import random_head
from graft.methods.eagle_tree import ExpandCall, SelectCall, expand, extend, select_rows
from graft.tree import select


def _slots(target, lengths: list[int]):
    """An EAGLE-3 head on the engine and one head cache per slot, each holding `lengths[b]` encoded positions."""
    head = random_head(target, "eagle3", seed=3, layer_ids=[1, 2, 3])
    head.lean(target.ops)
    embed = head.embedder(target.embed)
    generator = torch.Generator().manual_seed(0)
    caches, lasts = [], []
    for n in lengths:
        cache = head.new_cache(128)
        tokens = torch.randint(3, 200, (n,), generator=generator)
        out = extend(head, cache, embed(tokens), torch.randn(n, 3 * 64, generator=generator))
        caches.append(cache)
        lasts.append(out[-1])
    return head, embed, caches, lasts


def test_a_batch_expansion_gives_every_slot_the_candidates_and_tree_it_gets_alone(tiny, monkeypatch):
    """Three slots with different cached lengths; one stops at a checkpoint after 2 levels, one after `levels` 4,
    one expands all 5: the batch's candidates (tokens, scores, parents, levels) and selected trees, with keeps of
    several sizes, equal each slot's alone, bit for bit; the levels where two or more slots expand run as one
    head_rows forward each."""
    target = tiny("tiny_llama:packed").target
    head, embed, caches, lasts = _slots(target, [5, 9, 13])
    assert head.runs_rows(caches)
    stops = [None, lambda level, scores: level >= 2, None]
    levels = [None, None, 4]
    calls = [
        ExpandCall(head, embed, c, last, 5, 4, stop, cap) for c, last, stop, cap in zip(caches, lasts, stops, levels)
    ]
    with torch.inference_mode():
        alone = [
            expand(head, embed, c, last, 5, 4, stop, cap) for c, last, stop, cap in zip(caches, lasts, stops, levels)
        ]
    rows_calls = []
    rows = type(head.engine).rows
    monkeypatch.setattr(type(head.engine), "rows", lambda self, *a: rows_calls.append(len(a[2])) or rows(self, *a))
    together = ExpandCall.run_all(calls)
    assert [c.length for c in caches] == [5, 9, 13]  # the tree levels were scratch
    assert [f.levels for f in together] == [f.levels for f in alone] == [5, 2, 4]
    for one, batch in zip(alone, together):
        for field in ("tokens", "scores", "group_parent"):
            assert len(getattr(one, field)) == len(getattr(batch, field))
            assert all(torch.equal(a, b) for a, b in zip(getattr(one, field), getattr(batch, field))), field
    assert rows_calls == [3, 3, 2, 2]  # levels 0-3; level 4 has one slot left, which runs alone

    keeps = [30, 6, 12]
    trees = SelectCall.run_all([SelectCall(f, root, keep) for f, root, keep in zip(together, [7, 8, 9], keeps)])
    for found, root, keep, tree in zip(alone, [7, 8, 9], keeps, trees):
        want = select(found, root, keep)
        assert tree.num_nodes == keep + 1
        for field in ("tokens", "parents", "scores", "sources"):
            assert torch.equal(getattr(tree, field), getattr(want, field)), field


def test_a_batch_selection_never_keeps_a_level_a_slot_did_not_expand(tiny):
    """A slot stopped after its root's children asks for more nodes than it has: it gets all of them and no
    padding, beside a slot that expanded every level."""
    target = tiny("tiny_llama:packed").target
    head, embed, caches, lasts = _slots(target, [6, 6])
    stops = [None, lambda level, scores: True]
    found = ExpandCall.run_all(
        [ExpandCall(head, embed, c, last, 3, 4, stop) for c, last, stop in zip(caches, lasts, stops)]
    )
    assert [f.levels for f in found] == [3, 0]
    trees = select_rows(found, roots=[1, 2], keeps=[20, 20])
    assert [t.num_nodes for t in trees] == [21, 5]
    assert torch.equal(trees[1].tokens, select(found[1], 2, 20).tokens)
    assert int(trees[1].tokens.min()) >= 0


def _one_by_one(monkeypatch, call) -> None:
    monkeypatch.setattr(call, "run_all", staticmethod(lambda calls: [c.run() for c in calls]))


@pytest.mark.parametrize("method", ["eagle3", "graft"])
def test_a_batch_of_16_dispatches_at_most_twice_the_ops_per_step_of_one_sequence(method, monkeypatch):
    """ATen ops per full step (counted at the dispatcher, graft.bench batch-ops) at B = 16 are at most 2x those at
    B = 1 for EAGLE-3 and Graft: drafting, selection, retrieval, verification and acceptance run once for the
    batch. Negative control: with the slots' EAGLE expansions (eagle3) or Token-Recycling reads and updates
    (graft) run one by one, a batch of 8 already dispatches more than 2x."""
    from graft.bench import batch_ops
    from graft.retrieval.recycling import TableUpdate, TemplateRead

    target = batch_ops._target("tiny_llama", "packed")
    one = batch_ops.measure(target, method, 1)["ops"]
    many = batch_ops.measure(target, method, 16)["ops"]
    assert many <= 2 * one, (one, many)
    for call in [ExpandCall] if method == "eagle3" else [TemplateRead, TableUpdate]:
        _one_by_one(monkeypatch, call)
    per_slot = batch_ops.measure(target, method, 8)["ops"]
    assert per_slot > 2 * one, (one, per_slot)


def _tables(contents: list[list[list[int]]]):
    from graft.retrieval.recycling import SuccessorTable

    tables = [SuccessorTable(vocab_size=6, k=2) for _ in contents]
    for table, rows in zip(tables, contents):
        table.rows.copy_(torch.tensor(rows))
    return tables


ROWS = [
    [[1, 2], [3, 4], [5, -1], [0, 1], [-1, -1], [2, 0]],
    [[4, 4], [0, -1], [1, 3], [-1, -1], [2, 5], [3, 3]],
    [[-1, -1], [-1, -1], [0, 0], [1, 1], [2, 2], [5, 5]],
]
LOGITS = torch.tensor(
    [
        [0.0, 5.0, 4.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 2.0, 0.0, 9.0],
        [7.0, 0.0, 0.0, 0.0, 6.0, 0.0],
        [0.0, 0.0, 1.0, 0.0, 3.0, 0.0],
    ]
)


def test_a_batch_of_tables_joins_with_a_copy_only_when_its_storage_doubles():
    """B joins copied every earlier slot each time (O(B^2) bytes: about 5 GB at a 152K vocabulary and B = 32);
    the storage now doubles when full, so 9 tables take 4 copies and every table keeps its rows."""
    from graft.retrieval.recycling import SuccessorTable

    rows = [[[(b * 7 + v * 3 + r) % 6 for r in range(2)] for v in range(6)] for b in range(9)]
    tables = []
    for own in rows:
        table = SuccessorTable(6, k=2)
        table.rows.copy_(torch.tensor(own))
        tables.append(table)
    storages = []
    for table in tables[1:]:
        tables[0].join(table)
        if not storages or storages[-1] is not tables[0].storage:
            storages.append(tables[0].storage)
    assert [s.shape[0] for s in storages] == [2, 4, 8, 16] and len({id(t.storage) for t in tables}) == 1
    assert [t.slot for t in tables] == list(range(9)) and [t.rows.tolist() for t in tables] == rows


def test_a_batchs_recycling_tables_read_and_learn_in_one_pass_what_each_does_alone():
    """Three tables joined in one storage: one template read for all equals each table's read_template, and one
    update_tables (a repeated token in a slot, an empty node, each slot its own accepted path) leaves every table
    as its own update does."""
    from graft.retrieval.recycling import read_template, read_templates, update_tables
    from graft.tree import RankTree

    alone, joined = _tables(ROWS), _tables(ROWS)
    joined[0].join(joined[1])
    joined[0].join(joined[2])
    assert joined[2].storage is joined[0].storage and [t.slot for t in joined] == [0, 1, 2]
    assert [t.rows.tolist() for t in joined] == ROWS  # joining keeps each table's rows
    template = RankTree.make([-1, 0, 0, 1, 1, 2, 3], [0, 0, 1, 0, 1, 0, 0])
    read = read_templates(joined, template, anchors=torch.tensor([0, 2, 5]))
    assert read.tolist() == [read_template(t, template, a).tolist() for t, a in zip(alone, [0, 2, 5])]

    tokens = [torch.tensor([3, 1, 3, 4]), torch.tensor([2, -1]), torch.tensor([5, 5, 0])]
    logits = [LOGITS, LOGITS[1:3], LOGITS[:3]]  # separate blocks: one top-k each
    paths = [[0], [0, 1], [0, 2]]
    for table, t, block, path in zip(alone, tokens, logits, paths):
        on_path = torch.zeros(t.shape[0], dtype=torch.bool)
        on_path[path] = True
        table.update(t, block, on_path)
    update_tables(joined, tokens=tokens, logits=logits, paths=paths)
    assert [t.rows.tolist() for t in joined] == [t.rows.tolist() for t in alone]


def test_a_shared_table_taught_by_a_batch_keeps_the_later_slots_write():
    """One table for the batch (method.table=shared), taught by two slots at once: token 3 accepted in slot 0
    and verified but rejected in slot 1 holds slot 1's successors, as when slot 1's update follows slot 0's (a
    priority that let the accepted node win across slots would keep slot 0's)."""
    from graft.retrieval.recycling import update_tables

    one, shared = _tables(ROWS[:1]), _tables(ROWS[:1])
    tokens = [torch.tensor([3, 1]), torch.tensor([3])]
    logits = [LOGITS[:2], LOGITS[2:3]]
    one[0].update(tokens[0], logits[0], torch.tensor([True, False]))
    one[0].update(tokens[1], logits[1], torch.tensor([False]))
    update_tables(shared * 2, tokens=tokens, logits=logits, paths=[[0], []])
    assert shared[0].rows.tolist() == one[0].rows.tolist()
    assert shared[0].rows[3].tolist() == [0, 4]


def _block_sources(target, lengths: list[int]):
    """One random block drafter shared by the slots' sources (as a batch shares it), each with empty context
    caches, and each slot's `lengths[b]` positions of context features to encode."""
    from conftest import make_drafter

    sources = [make_drafter("dflash", target, checkpoint="random", block_size=5).source for _ in lengths]
    for source in sources[1:]:
        source.share_with(sources[0])
    generator = torch.Generator().manual_seed(4)
    width = sources[0].model.cfg.feature_size
    features = [torch.randn(n, width, generator=generator) for n in lengths]
    for source in sources:
        source.caches = source.model.new_caches(64)
    return sources, features


def test_a_batch_of_block_drafts_gives_every_slot_the_caches_and_log_probs_it_gets_alone(tiny, monkeypatch):
    """DFlash's drafter per slot no more: three slots of one random block drafter, with 5, 9 and 2 positions of
    context, encode their committed features as one forward (EncodeCall.run_all) and draft their blocks as one
    (BlockCall.run_all: every product and the LM head once over the three blocks, each block's attention over its
    own caches); each slot's caches and log-probabilities equal its own drafter's alone, bit for bit. Negative
    control: a block attending to another slot's caches differs."""
    from graft.methods.dflash import BlockCall, EncodeCall

    target = tiny("tiny_llama:packed").target
    alone, features = _block_sources(target, [5, 9, 2])
    together, _ = _block_sources(target, [5, 9, 2])
    blocks = []
    forward = type(together[0].model).block_rows
    monkeypatch.setattr(
        type(together[0].model), "block_rows", lambda m, e, c: blocks.append(len(c)) or forward(m, e, c)
    )
    with torch.inference_mode():
        for source, mine in zip(alone, features):
            source.model.encode(mine, source.caches)
        EncodeCall.run_all([EncodeCall(s, f) for s, f in zip(together, features)])
        want = [s.block_log_probs(root, 5) for s, root in zip(alone, [7, 8, 9])]
        got = BlockCall.run_all([BlockCall(s, root, 5) for s, root in zip(together, [7, 8, 9])])
    assert blocks[-1] == 3  # one forward for the three blocks (block_log_probs alone calls it with one)
    for a, b in zip(alone, together):
        assert [c.length for c in a.caches] == [c.length for c in b.caches]
        assert all(
            torch.equal(x.keys[..., : x.length, :], y.keys[..., : y.length, :]) for x, y in zip(a.caches, b.caches)
        )
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    with torch.inference_mode():
        swapped = BlockCall.run_all([BlockCall(s, root, 5) for s, root in zip(together[::-1], [7, 8, 9])])
    assert not torch.equal(swapped[0], want[0])
