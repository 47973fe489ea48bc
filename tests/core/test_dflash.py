"""The DFlash-style block drafter: its forward against a hand computation, the published layout, the
block's tree, the prefix split, and the trainer."""

import json
import math

import pytest
import torch
from conftest import load_tiny, make_drafter

from graft.backends.target import HiddenTap
from graft.draft_models.dflash.checkpoint import (
    BlockLoadError,
    block_config,
    load_block_drafter,
    random_block_drafter,
    save_block_drafter,
)
from graft.draft_models.dflash.model import spread_layer_ids
from graft.draft_models.dflash.train import block_accepted, block_hidden, block_losses, grown_state, sample_anchors
from graft.methods.dflash import block_candidates
from graft.methods.eagle3 import select
from graft.methods.pruned import PrefixParams, PrefixSplit


@pytest.fixture(scope="module")
def qwen():
    return load_tiny("tiny_qwen3")


def _drafter(target, **shape):
    model = random_block_drafter(target, 3, **shape).float()
    with torch.no_grad():  # smaller weights keep the hidden states in a range where errors would show
        for p in model.parameters():
            if p.ndim > 1:
                p.mul_(0.3)
    return model


def _features(target, model, ids):
    target.reset(len(ids) + 8)
    taps = tuple(HiddenTap(i, "output") for i in model.cfg.target_layer_ids)
    return target.prefill(ids, taps).hidden


def test_spread_layer_ids_follow_the_published_rule():
    assert spread_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab's Qwen3-8B drafters read these layers
    assert spread_layer_ids(64, 2) == [1, 61]
    assert spread_layer_ids(24, 1) == [12]


def test_block_forward_equals_a_hand_computation(qwen):
    """One layer written out with explicit softmax attention: the block attends to every context entry and
    to all of its own positions (no causal mask), with Qwen3's q / k norms and the rotary embedding."""
    target = qwen.target
    model = _drafter(target, num_layers=1, block_size=4)
    cfg = model.cfg
    ids = list(range(3, 23))
    feats = _features(target, model, ids)  # [20, F]
    block_ids = torch.tensor([ids[-1], cfg.mask_token_id, cfg.mask_token_id, cfg.mask_token_id])
    with torch.no_grad():
        caches = model.new_caches(4)
        model.encode(feats[:12], caches)  # in two parts: the cache carries across steps
        model.encode(feats[12:], caches)
        got = model.block(target.embed(block_ids), caches)

        layer, attn = model.layers[0], model.layers[0].self_attn
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        ctx = model.hidden_norm(model.fc(feats.float()))  # [20, H]
        x = target.embed(block_ids).float()  # [4, H]
        normed = layer.input_layernorm(x)
        positions = torch.arange(24)
        inv = model.rotary.inv_freq
        angles = positions[:, None].float() * inv[None, :]
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

        def rope(v, pos):  # v [n, heads, d]
            half = d // 2
            rotated = torch.cat([-v[..., half:], v[..., :half]], -1)
            return v * cos[pos][:, None] + rotated * sin[pos][:, None]

        q = rope(attn.q_norm(attn.q_proj(normed).view(4, h, d)), positions[20:])
        kv_in = torch.cat([ctx, normed])  # context first, then the block
        k = rope(attn.k_norm(attn.k_proj(kv_in).view(24, kvh, d)), positions)
        v = attn.v_proj(kv_in).view(24, kvh, d)
        out = torch.zeros(4, h, d)
        for head in range(h):
            kv = head // (h // kvh)
            weights = torch.softmax(q[:, head] @ k[:, kv].T / math.sqrt(d), dim=-1)  # [4, 24]: nothing masked
            out[:, head] = weights @ v[:, kv]
        x = x + attn.o_proj(out.reshape(4, h * d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        expected = model.norm(x)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_training_blocks_see_what_inference_blocks_see(qwen):
    """block_hidden lays many anchors side by side behind one mask; each must equal the inference forward
    over the context before its anchor."""
    target = qwen.target
    model = _drafter(target, num_layers=2, block_size=5)
    ids = list(range(5, 45))
    feats = _features(target, model, ids)
    anchors = torch.tensor([[7, 20, 33]])
    with torch.no_grad():
        batched = block_hidden(model, target.embed, feats[None].float(), torch.tensor([ids]), anchors, 5)
        for j, a in enumerate(anchors[0].tolist()):
            caches = model.new_caches(8)
            model.encode(feats[:a], caches)
            block = torch.tensor([ids[a]] + [model.cfg.mask_token_id] * 4)
            torch.testing.assert_close(model.block(target.embed(block), caches), batched[0, j], atol=1e-5, rtol=1e-4)


def test_a_drafter_grown_by_a_layer_starts_with_the_earlier_ones_outputs(qwen):
    """grown_state: a two-layer drafter warm-started from a one-layer one gives the same block outputs (the
    added layer's output projections are zero), yet the added layer's weights still receive gradients."""
    target = qwen.target
    small = _drafter(target, num_layers=1, block_size=4)
    big = _drafter(target, num_layers=2, block_size=4)
    big.load_state_dict(grown_state(small.state_dict(), big))
    ids = list(range(3, 23))
    feats = _features(target, small, ids)
    block = target.embed(torch.tensor([ids[-1]] + [small.cfg.mask_token_id] * 3))
    outputs = []
    for model in (small, big):
        caches = model.new_caches(4)
        with torch.no_grad():
            model.encode(feats, caches)
        outputs.append(model.block(block, caches))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-6, rtol=1e-5)
    outputs[1].square().sum().backward()
    assert big.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert big.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="2 layers; expected at most 1"):
        grown_state(big.state_dict(), small)


def test_block_losses_train_the_drafter(qwen):
    """A few optimiser steps on one sequence lower the loss (the gradient reaches every part)."""
    target = qwen.target
    model = _drafter(target, num_layers=1, block_size=6).train()
    ids = [5, 6, 7, 8, 9, 10, 11, 12] * 4
    feats = _features(target, model, ids)[None].clone()  # a normal tensor: autograd saves it
    tokens, valid = torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)
    anchors = sample_anchors(valid, 6, torch.Generator().manual_seed(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss, accs, counts = block_losses(model, target.embed, target.lm_head, feats, tokens, valid, anchors, 6, 4.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert len(accs) == 5 and sum(counts) > 0
    assert losses[-1] < 0.5 * losses[0], losses


def test_soft_labels_that_are_one_hot_give_the_hard_loss(qwen):
    """The soft-label loss reads the target's distribution at the position before each label: with all
    mass on the text's next token it is the hard cross-entropy; with mass elsewhere it differs."""
    target = qwen.target
    model = _drafter(target, num_layers=1, block_size=5)
    ids = list(range(5, 35))
    feats = _features(target, model, ids)[None].float()
    tokens, valid = torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)
    anchors = torch.tensor([[3, 11, 20]])
    soft_ids = torch.zeros(1, len(ids), 2, dtype=torch.long)
    soft_ids[0, :-1, 0] = tokens[0, 1:]  # position p's distribution predicts token p + 1
    soft_ids[0, :, 1] = 1
    one_hot = torch.tensor([1.0, 0.0]).expand(1, len(ids), 2)
    args = (model, target.embed, target.lm_head, feats, tokens, valid, anchors, 5, 4.0)
    with torch.no_grad():
        hard, accs, _ = block_losses(*args)
        soft, soft_accs, _ = block_losses(*args, soft_ids=soft_ids, soft_probs=one_hot)
        spread, _, _ = block_losses(
            *args, soft_ids=soft_ids, soft_probs=torch.tensor([0.5, 0.5]).expand(1, len(ids), 2)
        )
    torch.testing.assert_close(soft, hard)
    assert accs == soft_accs and abs(float(spread) - float(hard)) > 1e-3


def test_block_accepted_counts_the_leading_right_positions(qwen):
    """Chain acceptance per anchor, on literal predictions: the leading block positions whose argmax is the
    text's token, a miss or a position without a label ending the run."""
    target = qwen.target
    model = _drafter(target, num_layers=1, block_size=4)
    ids = list(range(100, 120))
    feats = _features(target, model, ids)[None].float()
    tokens, valid = torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)
    valid[0, 16:] = False
    anchors = torch.tensor([[2, 6, 10, 14]])
    predictions = torch.tensor(
        [
            [103, 104, 105],  # all three right
            [107, 200, 109],  # a miss at position 2 ends the run, whatever follows
            [0, 12, 13],  # wrong at once
            [115, 116, 117],  # right, but 16 and 17 carry no label
        ]
    )

    def literal_head(hidden):  # [1, A, 3, H] -> one-hot logits of the predictions
        return torch.nn.functional.one_hot(predictions, target.vocab_size).float()[None]

    with torch.no_grad():
        accepted = block_accepted(model, target.embed, literal_head, feats, tokens, valid, anchors, 4)
    assert accepted.tolist() == [[3, 1, 0, 1]]


def test_anchors_have_a_label_after_them():
    valid = torch.tensor([[False] * 5 + [True] * 5, [False] * 10])
    anchors = sample_anchors(valid, 3, torch.Generator().manual_seed(0))
    assert anchors.shape == (2, 3)
    assert all(valid[0, a + 1] for a in anchors[0].tolist())
    assert anchors[1].tolist() == [0, 0, 0]


def test_a_chain_from_literal_log_probs():
    logp = torch.log(torch.tensor([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]))
    found = block_candidates(logp, 1)
    tree = select(found, 9, 3)
    assert tree.tokens.tolist() == [9, 1, 0, 2] and tree.parents.tolist() == [-1, 0, 1, 2]
    torch.testing.assert_close(tree.scores[1:].exp(), torch.tensor([0.7, 0.42, 0.252]))


def test_a_tree_from_each_positions_top_k():
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.1], [0.6, 0.3, 0.1]]))
    found = block_candidates(logp, 2)
    tree = select(found, 9, 6)
    # depth 1: tokens 0 (0.5) and 1 (0.4); depth 2: 0 and 1 below each
    assert tree.tokens.tolist() == [9, 0, 1, 0, 1, 0, 1]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2, 2]
    torch.testing.assert_close(tree.scores[1:].exp(), torch.tensor([0.5, 0.4, 0.3, 0.15, 0.24, 0.12]))
    best4 = select(found, 9, 4)  # the best 4 by cumulative probability, ancestor-closed
    assert best4.tokens.tolist() == [9, 0, 1, 0, 0] and best4.parents.tolist() == [-1, 0, 0, 1, 2]


def test_prefix_split_keeps_the_leading_confident_positions():
    logp = torch.log(torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.05, 0.95], [0.5, 0.5]]))
    split = PrefixSplit(PrefixParams(prefix_threshold=0.85))
    split.start()
    found = block_candidates(logp, 1, split.stop_after)
    # per position 0.9, 0.8, 0.8, 0.95, 0.5: the second is below 0.85, so one position is kept
    assert split.keep(torch.cat(found.scores), 16) == 2 and split.label() == "prefix1"
    split = PrefixSplit(PrefixParams(prefix_threshold=0.75))
    split.start()
    found = block_candidates(logp, 1, split.stop_after)
    assert split.keep(torch.cat(found.scores), 16) == 5  # four positions >= 0.75, the fifth (0.5) stops it
    assert split.keep(torch.cat(found.scores), 3) == 3  # never more than the budget


def test_published_layout_round_trips_with_every_key_checked(qwen, tmp_path):
    target = qwen.target
    model = random_block_drafter(target, 1, num_layers=2, block_size=6)
    save_block_drafter(model, tmp_path / "ok")
    raw = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 6
    assert raw["dflash_config"]["target_layer_ids"] == model.cfg.target_layer_ids
    assert raw["num_target_layers"] == target.num_layers
    loaded = load_block_drafter(str(tmp_path / "ok"), target)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key

    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "ok" / "model.safetensors"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps(raw))
    dropped = dict(state)
    del dropped["layers.1.self_attn.k_norm.weight"]
    save_file(dropped, str(broken / "model.safetensors"))
    with pytest.raises(BlockLoadError, match=r"missing \['layers.1.self_attn.k_norm.weight'\]"):
        load_block_drafter(str(broken), target)
    save_file(
        {**state, "candidate_selector.hidden_projection.weight": torch.zeros(2, 2)}, str(broken / "model.safetensors")
    )
    with pytest.raises(BlockLoadError, match="unexpected \\['candidate_selector.hidden_projection.weight'\\]"):
        load_block_drafter(str(broken), target)
    save_file({**state, "fc.weight": torch.zeros(3, 3)}, str(broken / "model.safetensors"))
    with pytest.raises(BlockLoadError, match="fc.weight: expected"):
        load_block_drafter(str(broken), target)


def test_published_configs_are_read_field_by_field(qwen):
    config = qwen.target.config
    raw = {
        "hidden_size": config.hidden_size,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,  # not hidden / heads, as in Qwen3 checkpoints
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "block_size": 16,
        "num_target_layers": config.num_hidden_layers,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 7},
        "rope_theta": 1000000,
    }
    cfg = block_config(raw, config)
    assert (cfg.head_dim, cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (32, 16, 7, [1, 2])
    top_level = {**raw, "target_layer_ids": [0, 2], "mask_token_id": 5}  # some checkpoints put them here
    del top_level["dflash_config"]
    assert block_config(top_level, config).target_layer_ids == [0, 2]
    with pytest.raises(BlockLoadError, match="trained for a 36-layer target"):
        block_config({**raw, "num_target_layers": 36}, config)
    with pytest.raises(BlockLoadError, match="no dflash_config.mask_token_id"):
        block_config({**raw, "dflash_config": {"target_layer_ids": [1]}}, config)
    with pytest.raises(BlockLoadError, match="only full-attention"):
        block_config({**raw, "layer_types": ["sliding_attention"] * 3}, config)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"block_size": 0}, r"block_size=0: expected an integer >= 2"),
        ({"block_size": -4}, r"block_size=-4: expected an integer >= 2"),
        ({"block_size": 1}, r"block_size=1: expected an integer >= 2"),
        ({"block_size": 8.7}, r"block_size=8.7: expected an integer >= 2"),
        ({"block_size": "8"}, r"block_size='8': expected an integer"),
        ({"block_size": None}, r"block_size=None: expected an integer"),
        ({"dflash_config": {"target_layer_ids": [1.0, 2], "mask_token_id": 7}}, r"target_layer_ids=1.0: expected"),
        ({"dflash_config": {"target_layer_ids": [1, 9], "mask_token_id": 7}}, r"target_layer_ids=9: .* in 0\.\.\d"),
        ({"dflash_config": {"target_layer_ids": [1, -1], "mask_token_id": 7}}, r"target_layer_ids=-1"),
        ({"dflash_config": {"target_layer_ids": 2, "mask_token_id": 7}}, r"names no dflash_config.target_layer_ids"),
        ({"dflash_config": {"target_layer_ids": [1], "mask_token_id": 7.5}}, r"mask_token_id=7.5: expected"),
        ({"dflash_config": {"target_layer_ids": [1], "mask_token_id": True}}, r"mask_token_id=True: expected"),
    ],
)
def test_every_field_of_a_block_drafter_config_is_checked(qwen, change, message):
    config = qwen.target.config
    raw = {
        "hidden_size": config.hidden_size,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "block_size": 16,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 7},
    }
    with pytest.raises(BlockLoadError, match=message):
        block_config({**raw, **change}, config)
    missing = dict(raw)
    del missing["block_size"]
    with pytest.raises(BlockLoadError, match="names no block_size"):
        block_config(missing, config)


def test_dflash_methods_draft_blocks_of_the_configured_size(qwen):
    target = qwen.target
    ids = qwen.chat.prompt_ids([{"role": "user", "content": "Count to ten."}])
    from graft.decode import generate

    for method, params, most in [
        ("dflash", {"block_size": 6}, 6),
        ("dflash", {"block_size": 6, "total_tokens": 4}, 4),
        ("dflash_graft", {"block_size": 6, "total_tokens": 12}, 12),
        ("dflash_tree", {"block_size": 6, "total_tokens": 12}, 12),
    ]:
        drafter = make_drafter(method, target, **params)
        out = generate(target, drafter, ids, 12, qwen.stop_ids)
        assert max(out.nodes) <= most, (method, params)
        if method == "dflash":
            assert set(out.nodes) == {most}, (method, out.nodes)  # the dense chain: every position verified


@pytest.mark.slow
def test_trainer_runs_every_stage_and_its_drafter_loads(tmp_path):
    """python -m graft.train dflash on a tiny target: generate, features, fit, export, resume; then method=dflash
    runs the exported drafter losslessly."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "train"
    args = [
        sys.executable,
        "-m",
        "graft.train",
        "dflash",
        "model=tiny_llama",
        f"train.out_dir={out}",
        "train.data.num_gsm8k=4",
        "train.data.num_self_questions=4",
        "train.data.num_templated=6",
        "train.data.num_followups=3",
        "train.data.num_reworks=2",
        "train.data.num_code=3",
        "train.data.num_code_followups=2",
        "train.data.num_code_reviews=2",
        "train.data.num_passages=2",
        "train.data.num_summaries=3",
        "train.data.num_passages_more=1",
        "train.data.num_summaries_more=2",
        "train.data.max_new_tokens=24",
        "train.fit.epochs=1",
        "train.fit.heldout=4",
        "train.fit.eval_every=2",
        "train.fit.batch_sequences=4",
        "train.fit.block_min=4",
        "train.fit.block_max=6",
        "train.drafter.block_size=5",
        "train.drafter.num_layers=1",
        f"train.export.dir={out}/drafter",
        f"paths.data_root={tmp_path}",
    ]
    env = dict(os.environ, WANDB_MODE="disabled")
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics and {"loss", "acc_1", "acc_3", "expected_tau"} <= set(metrics[0])
    steps = [m for m in metrics if "loss" in m]
    assert 4 <= steps[-1]["block"] <= 6
    heldout = [m for m in metrics if "heldout_tau" in m]
    assert heldout and all(1.0 <= m["heldout_tau"] <= 5.0 for m in heldout)  # 1 + at most block_size - 1
    assert torch.load(out / "best.pt", weights_only=False)["best"]["step"] in {m["step"] for m in heldout}
    assert "soft_ids" in torch.load(next((out / "features").glob("shard_*.pt")))[0]
    conversations = (out / "conversations.jsonl").read_text()
    assert conversations.count('"rework-') == 2
    ids = [json.loads(line)["id"] for line in conversations.splitlines()]
    assert sum(i.startswith("code-") for i in ids) == 3 and sum(i.startswith("followup-code-") for i in ids) == 2
    assert sum(i.startswith("passage-") for i in ids) == 3 and sum(i.startswith("summary-") for i in ids) == 5
    assert sum(i.startswith("summary-more-") for i in ids) == 2
    again = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and len((out / "metrics.jsonl").read_text().splitlines()) == len(metrics)
    grown = tmp_path / "grown"  # a fit of a deeper drafter that starts from this one's best weights
    shutil.copytree(out / "features", grown / "features")
    swap = {
        "train.drafter.num_layers=1": "train.drafter.num_layers=2",
        f"train.out_dir={out}": f"train.out_dir={grown}",
    }
    grow_args = [swap.get(a, a) for a in args] + ["train.stage=fit", f"train.fit.init_from={out}/best.pt"]
    grow_args = [a.replace(f"{out}/drafter", f"{grown}/drafter") for a in grow_args]
    proc = subprocess.run(grow_args, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "warm start" in proc.stdout, proc.stderr[-3000:]
    assert json.loads((grown / "drafter" / "config.json").read_text())["num_hidden_layers"] == 2

    from baselines.autoregressive import Autoregressive
    from graft.decode import generate

    tiny = load_tiny("tiny_llama")
    drafter = make_drafter("dflash", tiny.target, checkpoint=str(out / "drafter"))
    ids = tiny.chat.prompt_ids([{"role": "user", "content": "Hello there."}])
    base = generate(tiny.target, Autoregressive(tiny.target), ids, 24, tiny.stop_ids)
    assert generate(tiny.target, drafter, ids, 24, tiny.stop_ids).new_tokens == base.new_tokens
    assert set(generate(tiny.target, drafter, ids, 24, tiny.stop_ids).nodes) <= {1, 2, 3, 4, 5}


def test_first_code_block_takes_the_fenced_code_without_its_language_tag():
    from graft.train.prompts import first_code_block

    answer = "Here it is:\n```python\ndef f(x):\n    return x\n```\nDone. ```js\nlet y = 1;\n```"
    assert first_code_block(answer) == "def f(x):\n    return x"
    assert first_code_block("```\nSELECT 1;\n```") == "SELECT 1;"
    assert first_code_block("no code here") is None and first_code_block("```\n\n```") is None


def test_summary_pairs_never_repeat_a_passage_with_the_same_request():
    from graft.train.prompts import summary_pairs

    assert summary_pairs(7, 3, 2) == [(0, 0), (1, 1), (2, 0), (0, 1), (1, 0), (2, 1)]  # capped at 3 x 2
    pairs = summary_pairs(240, 120, 6)  # round 4's counts, whose old rule repeated 120 of them
    assert len(set(pairs)) == 240 and pairs[:120] == [(i, i % 6) for i in range(120)]
    assert summary_pairs(5, 0, 6) == []


def test_a_held_out_pool_keeps_the_held_out_set_when_data_is_appended():
    from graft.train.dflash import split_heldout

    records = [{"i": i} for i in range(10)]
    _, before = split_heldout(records[:6], 3, seed=0)
    train, after = split_heldout(records, 3, seed=0, pool=6)
    assert after == before and all(r["i"] < 6 for r in after)
    assert len(train) == 7 and {r["i"] for r in train} | {r["i"] for r in after} == set(range(10))


def test_code_requests_added_later_keep_the_earlier_ids_texts():
    """Round 5 appended CODE_TASKS_MORE: code-0 .. code-207 must still name round 4's requests."""
    import random

    from graft.train.prompts import CODE_SHAPES, CODE_TASKS, CODE_TASKS_MORE, SQL_TASKS, code_requests

    earlier = [shape.format(t=task) for task in CODE_TASKS for shape in CODE_SHAPES]
    earlier += [f"Write a SQL query that {task}." for task in SQL_TASKS]
    random.Random(0 + 2).shuffle(earlier)  # how round 4 ordered them (seed 0)
    requests = code_requests(0)
    assert requests[: len(earlier)] == earlier
    assert len(requests) == len(earlier) + len(CODE_TASKS_MORE) * len(CODE_SHAPES) == 408
    assert len(set(requests)) == len(requests)


def test_templated_and_passage_requests_added_later_keep_the_earlier_ids_texts():
    """Round 6 appended TOPICS_MORE: templated-0 .. 799 and passage-0 .. 119 must still name the requests
    of the earlier rounds, and no new request repeats an earlier one."""
    import random

    from graft.train.prompts import PASSAGES, TEMPLATES, TOPICS, TOPICS_MORE, passage_groups, templated_requests

    earlier = [template.format(t=topic) for template in TEMPLATES for topic in TOPICS]
    requests = templated_requests(0)
    assert requests[:800] == earlier and len(requests) == 1600 == len(set(requests))
    passages = [shape.format(t=topic) for topic in TOPICS for shape in PASSAGES]
    random.Random(0 + 3).shuffle(passages)  # how rounds 4 and 5 ordered them (seed 0)
    first, more = passage_groups(0)
    assert first == passages and len(more) == 120 and not set(first) & set(more)
    assert not set(TOPICS) & set(TOPICS_MORE)
