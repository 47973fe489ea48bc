"""EAGLE heads: checkpoint layouts, strict loading, and the dynamic tree against a plain reference."""

import json

import pytest
import torch

from graft.draft_models.eagle.checkpoint import HeadLoadError, load_head, random_head, save_head
from graft.draft_models.eagle.head import DraftHead
from graft.methods.eagle3 import select
from graft.methods.eagle_tree import expand, extend
from graft.tree import topology


def _same_weights(a: DraftHead, b: DraftHead):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize(
    "layout,kind,draft_vocab",
    [("eagle", "eagle3", None), ("specforge", "eagle3", None), ("eagle", "eagle3", 100), ("eagle", "eagle1", None)],
)
def test_published_layouts_round_trip(tiny, tmp_path, layout, kind, draft_vocab):
    model = tiny("tiny_llama").target
    head = random_head(model, kind, seed=3, layer_ids=[1, 2, 3] if kind == "eagle3" else None, draft_vocab=draft_vocab)
    save_head(head, tmp_path / "h", layout)
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    assert raw["architectures"] == (["LlamaForCausalLMEagle3"] if layout == "specforge" else ["LlamaForCausalLM"])
    loaded = load_head(str(tmp_path / "h"), model)
    assert loaded.cfg.kind == kind and loaded.cfg.layer_ids == head.cfg.layer_ids
    _same_weights(head, loaded)


def test_bin_weights_and_dropped_vocab_maps_load(tiny, tmp_path):
    model = tiny("tiny_llama").target
    head = random_head(model, "eagle3", seed=1, layer_ids=[1, 2, 3])
    save_head(head, tmp_path / "h")
    state = {k: v for k, v in head.state_dict().items() if k not in ("d2t", "t2d")}  # equal vocabularies: maps omitted
    state["embed_tokens.weight"] = torch.zeros(1)  # the target's embeddings may ride along; they are ignored
    (tmp_path / "h" / "model.safetensors").unlink()
    torch.save(state, tmp_path / "h" / "pytorch_model.bin")
    _same_weights(head, load_head(str(tmp_path / "h"), model))


def test_missing_unexpected_and_misshapen_weights_are_refused(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny("tiny_llama").target
    save_head(random_head(model, "eagle3", layer_ids=[1, 2, 3]), tmp_path / "h")
    weights = tmp_path / "h" / "model.safetensors"
    state = load_file(str(weights))
    broken = dict(state)
    del broken["midlayer.hidden_norm.weight"]
    broken["midlayer.extra.weight"] = torch.zeros(2)
    save_file(broken, str(weights))
    with pytest.raises(HeadLoadError) as err:
        load_head(str(tmp_path / "h"), model)
    assert "midlayer.hidden_norm.weight" in str(err.value) and "midlayer.extra.weight" in str(err.value)
    broken = dict(state)
    broken["fc.weight"] = torch.zeros(64, 100)
    save_file(broken, str(weights))
    with pytest.raises(HeadLoadError, match=r"fc\.weight: expected \(64, 192\), got \(64, 100\)"):
        load_head(str(tmp_path / "h"), model)


def test_a_head_for_another_target_is_refused_with_both_sizes(tiny, tmp_path):
    model = tiny("tiny_llama").target
    save_head(random_head(model, "eagle3", layer_ids=[1, 2, 3]), tmp_path / "h")
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    raw["target_hidden_size"] = 4096
    (tmp_path / "h" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(HeadLoadError, match="width 4096.*hidden size is 64"):
        load_head(str(tmp_path / "h"), model)
    with pytest.raises(HeadLoadError, match="no such directory"):
        load_head(str(tmp_path / "nope"), model)


def test_a_head_whose_head_dim_is_not_hidden_over_heads_loads_and_runs(tiny, tmp_path):
    """SpecForge's Qwen3-235B-A22B head: hidden 4096, 64 heads, 4 KV heads, head_dim 128 (so q_proj is 8192 x
    4096-in, not 4096 x 4096). Here at tiny dims: hidden 64, 8 heads, 2 KV heads, head_dim 16 (64 / 8 = 8)."""
    from safetensors.torch import save_file

    model = tiny("tiny_llama").target
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "vocab_size": model.vocab_size,
        "draft_vocab_size": 100,
        "target_hidden_size": 64,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    }
    shapes = {
        "fc.weight": (64, 192),
        "midlayer.self_attn.q_proj.weight": (8 * 16, 128),
        "midlayer.self_attn.k_proj.weight": (2 * 16, 128),
        "midlayer.self_attn.v_proj.weight": (2 * 16, 128),
        "midlayer.self_attn.o_proj.weight": (64, 8 * 16),
        "midlayer.mlp.gate_proj.weight": (96, 64),
        "midlayer.mlp.up_proj.weight": (96, 64),
        "midlayer.mlp.down_proj.weight": (64, 96),
        "midlayer.hidden_norm.weight": (64,),
        "midlayer.input_layernorm.weight": (64,),
        "midlayer.post_attention_layernorm.weight": (64,),
        "norm.weight": (64,),
        "lm_head.weight": (100, 64),
    }
    torch.manual_seed(0)
    state = {k: torch.randn(shape) * 0.1 for k, shape in shapes.items()}
    state["d2t"] = torch.zeros(100, dtype=torch.long)
    state["t2d"] = torch.zeros(model.vocab_size, dtype=torch.bool)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text(json.dumps(raw))
    save_file(state, str(tmp_path / "h" / "model.safetensors"))
    head = load_head(str(tmp_path / "h"), model)
    assert head.cfg.head_dim == 16 and head.cfg.layer_ids == [1, 2, 3]
    cache = head.new_cache(16)
    out = head.step(torch.randn(5, 64), torch.randn(5, 192), torch.arange(5), None, cache)
    assert out.shape == (5, 64) and torch.isfinite(out).all()
    log_probs, offsets = head.log_probs(out)
    assert log_probs.shape == (5, 100) and offsets is not None
    save_head(head, tmp_path / "again", "specforge")  # head_dim survives a round trip
    assert json.loads((tmp_path / "again" / "config.json").read_text())["head_dim"] == 16
    _same_weights(head, load_head(str(tmp_path / "again"), model))


# --- the tree ------------------------------------------------------------------------------------------


def _reference_tree(head, embed, prefix_tokens, prefix_hidden, root, total_tokens, depth, k):
    """Exhaustive expansion then sort, with every node's output computed from scratch along its path."""

    def path_output(path):  # path: list of (token, hidden input) from the first draft node down
        cache = head.new_cache(64)
        out = extend(head, cache, embed(torch.tensor(prefix_tokens)), prefix_hidden)
        if not path:
            return out[-1]
        tokens = torch.tensor([t for t, _ in path])
        hidden = torch.stack([h for _, h in path])
        positions = torch.arange(len(prefix_tokens), len(prefix_tokens) + len(path))
        return head.step(embed(tokens), hidden, positions, None, cache)[-1]

    def children(node):  # node: dict(path, score, out)
        logp, d2t = head.log_probs(node["out"][None])
        top = torch.topk(logp[0], k)
        kids = []
        for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
            target_tok = tok + int(d2t[tok]) if d2t is not None else tok
            path = node["path"] + [(target_tok, node["out"])]
            kids.append({"path": path, "score": node["score"] + lp, "parent": node})
        return kids

    root_node = {"path": [], "score": 0.0, "out": path_output([]), "parent": None}
    candidates = children(root_node)
    frontier = candidates[:]
    for _ in range(depth):
        for node in frontier:
            node["out"] = path_output(node["path"])
        new = [kid for node in frontier for kid in children(node)]
        candidates += new
        order = sorted(range(len(new)), key=lambda i: -new[i]["score"])[:k]
        frontier = [new[i] for i in order]
    best = sorted(sorted(range(len(candidates)), key=lambda i: -candidates[i]["score"])[: total_tokens - 1])
    index_of = {id(candidates[i]): pos + 1 for pos, i in enumerate(best)}
    tokens = [root] + [candidates[i]["path"][-1][0] for i in best]
    parents = [-1] + [index_of.get(id(candidates[i]["parent"]), 0) for i in best]
    return tokens, parents


@pytest.mark.parametrize("kind,draft_vocab", [("eagle3", None), ("eagle3", 120), ("eagle1", None)])
@pytest.mark.parametrize("total_tokens,depth,k", [(12, 3, 3), (20, 4, 4), (4, 3, 1)])
def test_tree_equals_the_exhaustive_reference(tiny, kind, draft_vocab, total_tokens, depth, k):
    model = tiny("tiny_llama").target
    torch.manual_seed(0)
    # float64 throughout: random heads fall into loops whose candidates' scores differ by ~1e-6, and
    # the reference must break those near-ties the same way the tree does
    head = random_head(
        model, kind, seed=7, layer_ids=[1, 2, 3] if kind == "eagle3" else None, draft_vocab=draft_vocab
    ).double()
    head._target_lm_head = [torch.nn.Linear(64, 272, bias=False).double()]
    head._target_lm_head[0].weight.data = model.model.get_output_embeddings().weight.double()
    embed = torch.nn.Embedding.from_pretrained(model.model.get_input_embeddings().weight.double())
    width = 3 * 64 if kind == "eagle3" else 64
    prefix_tokens = [5, 99, 13, 200, 42]
    prefix_hidden = torch.randn(len(prefix_tokens), width, dtype=torch.float64)
    with torch.inference_mode():
        cache = head.new_cache(64)
        out = extend(head, cache, embed(torch.tensor(prefix_tokens)), prefix_hidden)
        tree = select(expand(head, embed, cache, out[-1], depth, k), 7, total_tokens - 1)
        assert cache.length == len(prefix_tokens)  # tree levels were scratch
        ref_tokens, ref_parents = _reference_tree(head, embed, prefix_tokens, prefix_hidden, 7, total_tokens, depth, k)
    assert tree.tokens.tolist() == ref_tokens
    assert tree.parents.tolist() == ref_parents
    tree.validate()
    assert tree.num_nodes == min(total_tokens, 1 + k + depth * k * k)
    assert int(topology(tree.parents, 0).depth.max()) <= depth + 1


@pytest.mark.slow
def test_trainer_runs_every_stage_and_its_head_loads(tmp_path):
    """python -m graft.train eagle3 on a tiny target: generate, features, fit (TTT), export, then resume."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "train"
    args = [
        sys.executable,
        "-m",
        "graft.train",
        "eagle3",
        "model=tiny_llama",
        f"train.out_dir={out}",
        "train.data.num_gsm8k=4",
        "train.data.num_self_questions=4",
        "train.data.num_templated=6",
        "train.data.num_followups=3",
        "train.data.max_new_tokens=24",
        "train.head.draft_vocab=64",
        "train.fit.epochs=1",
        "train.fit.batch_sequences=4",
        "train.fit.ttt_steps=3",
        f"train.export.dir={out}/head",
        f"paths.data_root={tmp_path}",  # no GSM8K here: the trainer must say so and go on
    ]
    env = dict(__import__("os").environ, WANDB_MODE="disabled")
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    convs = {c["id"]: c for c in map(json.loads, (out / "conversations.jsonl").read_text().splitlines())}
    followups = [jid for jid in convs if jid.startswith("followup-")]
    assert len(followups) == 3 and not any(jid.startswith("followup-gsm8k") for jid in followups)
    for jid in followups:  # the second turn's prompt carries the first turn and the target's own answer
        first = convs[jid.removeprefix("followup-")]
        assert len(convs[jid]["prompt_ids"]) > len(first["prompt_ids"]) + len(first["answer_ids"]) // 2
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics and {"loss_0", "loss_2", "acc_0", "acc_2"} <= set(metrics[-1])
    raw = json.loads((out / "head" / "config.json").read_text())
    assert raw["draft_vocab_size"] == 64 and raw["architectures"] == ["LlamaForCausalLM"]
    from conftest import load_tiny

    head = load_head(str(out / "head"), load_tiny("tiny_llama").target)
    assert int(head.t2d.sum()) == 64
    again = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and len((out / "metrics.jsonl").read_text().splitlines()) == len(
        metrics
    )  # resumed, nothing redone


@torch.inference_mode()
def test_static_tree_follows_the_choices_and_the_head_ranks(tiny):
    """EAGLE-1's static tree: node shape from the choices; each child is its parent's rank-r head token,
    checked against the head run on the ancestor path alone (a chain, no tree mask)."""
    from conftest import make_drafter

    from graft.drafter import PrefillInfo, SequenceState
    from graft.methods.eagle3 import MC_SIM_7B_63

    model = tiny("tiny_llama")
    drafter = make_drafter("eagle3_static", model.target)
    ids = [5, 9, 14, 3, 7, 11]
    model.target.reset(64)
    prefill = model.target.prefill(ids, drafter.needs.taps)
    state = SequenceState(tokens=ids + [int(prefill.logits[-1].argmax())], prompt_len=len(ids))
    drafter.reset(PrefillInfo(state=state, forward=prefill))
    tree = drafter.propose(state).tree
    assert tree.num_nodes == 1 + len(MC_SIM_7B_63) == drafter.max_nodes()
    depth = topology(tree.parents, 0).depth.tolist()
    assert sorted(depth[1:]) == sorted(len(c) for c in MC_SIM_7B_63)
    source = drafter.source
    head, cache, embed, plan = source.runner.head, source.runner.cache, model.target.embed, source.plan
    committed = cache.length
    # reference: for every node, rerun the head on its own path as a chain and compare the chosen rank
    for node in range(1, tree.num_nodes):
        path = []
        walk = node
        while walk > 0:
            path.append(walk)
            walk = int(tree.parents[walk])
        path.reverse()  # depth 1 .. node
        out = source.runner.last
        cache.length = committed
        for depth_i, p in enumerate(path[:-1]):
            out = head.step(embed(tree.tokens[p : p + 1]), out[None], torch.tensor([committed + depth_i]), None, cache)[
                0
            ]
        logp, d2t = head.log_probs(out[None])
        rank = int(plan.shape.ranks[node])
        pick = int(torch.topk(logp[0], plan.width).indices[rank])
        pick = pick + int(d2t[pick]) if d2t is not None else pick
        assert pick == int(tree.tokens[node]), f"node {node}"
    cache.length = committed


def test_soft_labels_reduce_to_the_hard_loss_and_skip_ids_outside_the_draft_vocab(tiny):
    """A one-hot target distribution gives the hard cross-entropy; mass on a token outside the draft
    vocabulary is dropped and the rest renormalised, so it cannot change the loss."""
    from graft.draft_models.eagle.train import ttt_losses

    model = tiny("tiny_llama").target
    head = random_head(model, "eagle3", draft_vocab=120, seed=0)
    embed = model.embed
    torch.manual_seed(0)
    draft_ids = torch.arange(120) + head.d2t
    outside = int(torch.nonzero(~head.t2d)[0])
    tokens = draft_ids[torch.randint(0, 120, (2, 12))]  # [B, T], every token in the draft vocabulary
    valid = torch.ones(2, 12, dtype=torch.bool)
    features = torch.randn(2, 12, 3 * model.config.hidden_size)
    hard, _ = ttt_losses(head, embed, features, tokens, valid, 3)
    soft_ids = torch.full((2, 12, 2), outside)  # [B, T, K]: slot 0 the next token, slot 1 outside the vocabulary
    soft_ids[:, :-1, 0] = tokens[:, 1:]
    soft_probs = torch.tensor([0.7, 0.3]).expand(2, 12, 2)
    soft, _ = ttt_losses(head, embed, features, tokens, valid, 3, soft_ids=soft_ids, soft_probs=soft_probs)
    for h, s in zip(hard, soft):
        assert torch.allclose(h, s, atol=1e-5)
    soft_ids[:, :, 1] = draft_ids[0]  # now real mass on another draft token: the loss must change
    mixed, _ = ttt_losses(head, embed, features, tokens, valid, 3, soft_ids=soft_ids, soft_probs=soft_probs)
    assert not torch.allclose(mixed[0], hard[0])


def test_broken_head_files_are_one_line_errors_that_name_the_file(tiny, tmp_path):
    model = tiny("tiny_llama").target
    save_head(random_head(model, "eagle3", layer_ids=[1, 2, 3]), tmp_path / "h")
    config, weights = tmp_path / "h" / "config.json", tmp_path / "h" / "model.safetensors"
    good_config, good_weights = config.read_text(), weights.read_bytes()
    config.write_text("{not json")
    with pytest.raises(HeadLoadError, match=r"config.json: not valid JSON"):
        load_head(str(tmp_path / "h"), model)
    raw = json.loads(good_config)
    del raw["hidden_size"]
    config.write_text(json.dumps(raw))
    with pytest.raises(HeadLoadError, match=r"config.json: missing the key 'hidden_size'"):
        load_head(str(tmp_path / "h"), model)
    config.write_text(good_config)
    weights.write_bytes(good_weights[: len(good_weights) // 2])  # torn by an interrupted download
    with pytest.raises(HeadLoadError, match=r"model.safetensors: not a readable safetensors file"):
        load_head(str(tmp_path / "h"), model)


def _double_head(tiny):
    model = tiny("tiny_llama").target
    torch.manual_seed(0)
    head = random_head(model, "eagle3", seed=7, layer_ids=[1, 2, 3]).double()
    embed = torch.nn.Embedding.from_pretrained(model.model.get_input_embeddings().weight.double())
    prefix_tokens = [5, 99, 13, 200, 42]
    prefix_hidden = torch.randn(len(prefix_tokens), 3 * 64, dtype=torch.float64)
    return head, embed, prefix_tokens, prefix_hidden


@pytest.mark.parametrize("total_tokens", [2, 3, 4, 6, 8, 11, 16])
def test_a_small_budget_drafts_only_what_it_can_keep_and_the_same_tree(tiny, total_tokens):
    """EagleSource's caps (Split.widest_useful, Split.levels_needed) on the dense split: a frontier of at most
    total_tokens - 1 nodes and no level past depth total_tokens - 1 keep exactly the tree of the full
    top_k 10, depth 7 expansion, with fewer head rows."""
    from graft.parts import DenseSplit

    head, embed, prefix_tokens, prefix_hidden = _double_head(tiny)
    split = DenseSplit()
    width, levels = split.widest_useful(total_tokens), split.levels_needed(total_tokens)
    assert (width, levels) == (total_tokens - 1, total_tokens - 2)
    with torch.inference_mode():
        trees = []
        for top_k, cap in ((10, None), (min(10, width), levels)):
            cache = head.new_cache(64)
            out = extend(head, cache, embed(torch.tensor(prefix_tokens)), prefix_hidden)
            found = expand(head, embed, cache, out[-1], 7, top_k, None, cap)
            trees.append(select(found, 7, total_tokens - 1))
            if cap is not None:
                assert found.levels == min(7, levels) and found.top_k == min(10, width)
    assert trees[1].tokens.tolist() == trees[0].tokens.tolist()
    assert trees[1].parents.tolist() == trees[0].parents.tolist()


@pytest.mark.parametrize("total_tokens", [3, 6, 12])
@pytest.mark.parametrize("thresholds", [[0.35, 0.25, 0.15], [0.0, 0.0, 0.9], [0.0, 0.0, 0.0]])
def test_the_stage_split_drafts_to_its_last_checkpoint_and_keeps_the_same_tree(tiny, total_tokens, thresholds):
    """The pruned tree's depth cap runs every checkpoint (keep and the stage label read them) and stops below
    the deepest node a budget can keep: the same tree, stage and kept count as the uncapped draft."""
    from graft.methods.pruned import StageParams, StageSplit

    head, embed, prefix_tokens, prefix_hidden = _double_head(tiny)
    results = []
    with torch.inference_mode():
        for capped in (False, True):
            split = StageSplit(StageParams(thresholds=thresholds))
            split.start()
            cache = head.new_cache(64)
            out = extend(head, cache, embed(torch.tensor(prefix_tokens)), prefix_hidden)
            levels = split.levels_needed(total_tokens) if capped else None
            found = expand(head, embed, cache, out[-1], 7, 10, split.stop_after, levels)
            keep = split.keep(torch.cat(found.scores), total_tokens)
            tree = select(found, 7, keep - 1)
            results.append((tree.tokens.tolist(), tree.parents.tolist(), keep, split.label(), found.levels))
    assert results[1][:4] == results[0][:4]
    assert results[1][4] <= max(total_tokens - 2, 5)
