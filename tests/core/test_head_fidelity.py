"""Fidelity to the published EAGLE heads: every config field that changes the computation is honoured (the
rotary embedding with its scaling, head_dim, bias flags, norms), checked against transformers' own Llama
layer built from the same config; exported heads load in a strict loader of EAGLE's layout; and Graft's
attach=leaves continues real leaves within its budget from the retrievers it is given."""

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from graft.draft_models.eagle.checkpoint import HeadLoadError, head_config, load_head, random_head, save_head
from graft.draft_models.eagle.head import DraftHead
from graft.ops import Ops

VOCAB, DRAFT_VOCAB, TARGET_HIDDEN = 100, 40, 64
TARGET = SimpleNamespace(hidden_size=TARGET_HIDDEN, vocab_size=VOCAB, num_hidden_layers=8)

# Head configs shaped like the published ones (docs/published_heads.md), at tiny sizes. Every field the
# published config carries is kept, including those that change nothing, so that a field the loader
# mishandles shows up here.
LLAMA31_EAGLE3 = {  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's fields, as in EAGLE's eagle/traineagle3/config.json
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": VOCAB,
    "draft_vocab_size": DRAFT_VOCAB,
}
CONFIGS = {
    "llama31_eagle3": LLAMA31_EAGLE3,
    # a Llama-3.1 head that carries its target's rope (the form of SpecForge / NVIDIA Llama-3.1 heads):
    # llama3 scaling, theta 500000, head_dim apart from hidden / heads, explicit bias flags
    "llama31_rope_scaled": {
        **LLAMA31_EAGLE3,
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": 24,
        "pretraining_tp": 1,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "max_position_embeddings": 131072,
    },
    # EAGLE3-LLaMA3.3-Instruct-70B: a head narrower than its target, reading target features of the
    # target's width through fc and carrying its own token embeddings
    "llama33_narrow": {**LLAMA31_EAGLE3, "hidden_size": 48, "target_hidden_size": TARGET_HIDDEN},
    # AngelSlim/Qwen3-{8B,14B}_eagle3 (AngelSlim's qwen3-*-eagle3.json): Qwen3 leftovers, head_dim 128 apart
    "angelslim_qwen3": {
        "architectures": ["Eagle3LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
    },
    # lmsys/Qwen3-235B-A22B-EAGLE3 (SpecForge's qwen3-235B-A22B-eagle3.json): 64 heads of 128 in 4096
    "lmsys_qwen3_235b": {
        "architectures": ["LlamaForCausalLMEagle3"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "use_aux_hidden_state": True},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "draft_vocab_size": DRAFT_VOCAB,
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "max_position_embeddings": 40960,
        "model_type": "llama",
        "num_attention_heads": 8,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": VOCAB,
    },
    # not a published head: the bias flags set, and transformers 5's rope_parameters with yarn scaling
    "biased_yarn_v5": {
        **LLAMA31_EAGLE3,
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "rope_theta": 20000.0,
        },
    },
    # older configs name the scaling "type" (EAGLE's own reader wants it so)
    "linear_type_key": {**LLAMA31_EAGLE3, "rope_theta": 30000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    # yuhuili/EAGLE-Vicuna-7B-v1.3 (EAGLE-1; EAGLE's eagle/train/vicuna_7B_config.json)
    "vicuna_eagle1": {
        key: value for key, value in LLAMA31_EAGLE3.items() if key not in ("draft_vocab_size", "num_key_value_heads")
    }
    | {"hidden_size": TARGET_HIDDEN, "rms_norm_eps": 1e-06},
}


def _randomized(cfg) -> DraftHead:
    """A head with every weight, norm and bias random, so that no field can hide behind a default value."""
    torch.manual_seed(0)
    head = DraftHead(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.2 if p.ndim > 1 else 0.1)
    return head.eval()


def _transformers_config(raw: dict):
    """transformers' LlamaConfig from the head's config.json as it stands (the reference's own reading)."""
    from transformers import LlamaConfig

    return LlamaConfig(**raw, attn_implementation="eager")


def _reference_attention(config, ours, in_features: int):
    """transformers' LlamaAttention with our weights; an EAGLE-3 layer's q/k/v read [embedding; hidden] (2H)."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    attn = LlamaAttention(config, layer_idx=0)
    if in_features != config.hidden_size:
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(in_features, old.out_features, bias=config.attention_bias))
    attn.load_state_dict(ours.state_dict(), strict=True)
    return attn.eval()


def _reference_norm(config, ours):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(ours.weight.shape[0], eps=config.rms_norm_eps)
    norm.load_state_dict(ours.state_dict())
    return norm


def _reference_layer(raw: dict, layer, hidden_in, embeds, positions):
    """The head's decoder layer computed with transformers' Llama modules and rotary embedding."""
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRotaryEmbedding

    config = _transformers_config(raw)
    n = hidden_in.shape[1]
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    mlp = LlamaMLP(config)
    mlp.load_state_dict(layer.mlp.state_dict(), strict=True)
    if embeds is not None:  # EAGLE-3: attention over [norm(embedding); norm(hidden)]
        x = torch.cat(
            [
                _reference_norm(config, layer.input_layernorm)(embeds),
                _reference_norm(config, layer.hidden_norm)(hidden_in),
            ],
            dim=-1,
        )
    else:  # EAGLE-1: the fused input goes straight in
        x = hidden_in
    attn = _reference_attention(config, layer.self_attn, x.shape[-1])
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])
    out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=causal)
    h = hidden_in + out
    return h + mlp(_reference_norm(config, layer.post_attention_layernorm)(h))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_rotary_table_equals_transformers(name):
    """cos / sin at positions 0..4095 are transformers' LlamaRotaryEmbedding's for the same config, bit for
    bit (scaled frequencies and yarn's attention factor included)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = CONFIGS[name]
    cfg = head_config(raw, TARGET)
    head = DraftHead(cfg)
    attn = head.midlayer.self_attn if cfg.kind == "eagle3" else head.layers[0].self_attn
    x = torch.zeros(1, 4, cfg.head_dim)
    cos, sin = attn._rotary_table(4096, x)
    ref_cos, ref_sin = LlamaRotaryEmbedding(_transformers_config(raw))(x, torch.arange(4096)[None])
    assert cos.shape[1] == ref_cos.shape[-1] == cfg.head_dim
    assert torch.equal(cos[:4096], ref_cos[0]) and torch.equal(sin[:4096], ref_sin[0])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_one_layer_forward_equals_transformers(name):
    raw = CONFIGS[name]
    cfg = head_config(raw, TARGET)
    head = _randomized(cfg)
    torch.manual_seed(1)
    n = 7
    positions = torch.arange(n)
    hidden = torch.randn(1, n, cfg.hidden_size)
    with torch.no_grad():
        if cfg.kind == "eagle3":
            embeds = torch.randn(1, n, cfg.hidden_size)
            ours = head.midlayer(embeds, hidden, positions, None, None)
            ref = _reference_layer(raw, head.midlayer, hidden, embeds, positions)
        else:
            ours = head.layers[0](hidden, positions, None, None)
            ref = _reference_layer(raw, head.layers[0], hidden, None, positions)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_config_fields_are_read():
    scaled = head_config(CONFIGS["llama31_rope_scaled"], TARGET)
    assert scaled.rope_theta == 500000.0 and scaled.rope_scaling["rope_type"] == "llama3"
    assert scaled.head_dim == 24 and scaled.rms_norm_eps == 1e-05
    plain = head_config(LLAMA31_EAGLE3, TARGET)  # no rope_theta: EAGLE's and transformers' default, 10000
    assert plain.rope_theta == 10000.0 and plain.rope_scaling is None and plain.head_dim == 16
    biased = head_config(CONFIGS["biased_yarn_v5"], TARGET)
    assert biased.attention_bias and biased.mlp_bias and biased.rope_theta == 20000.0
    assert biased.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    head = DraftHead(biased)
    assert head.midlayer.self_attn.o_proj.bias is not None and head.midlayer.mlp.down_proj.bias is not None
    assert head_config(CONFIGS["lmsys_qwen3_235b"], TARGET).layer_ids == [2, 4, 6]
    qwen2_eagle1 = DraftHead(head_config({**CONFIGS["vicuna_eagle1"], "qkv_bias": True}, TARGET))  # EAGLE-Qwen2 heads
    attn = qwen2_eagle1.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.v_proj.bias is not None and attn.o_proj.bias is None
    narrow = head_config(CONFIGS["llama33_narrow"], TARGET)
    assert narrow.own_embeddings and DraftHead(narrow).fc.weight.shape == (48, 3 * TARGET_HIDDEN)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "partial_rotary_factor": 0.5}}, "partial_rotary"),
        ({"eagle_config": {"use_aux_hidden_state": False}}, "use_aux_hidden_state"),
        ({"fc_norm": True}, "fc_norm"),
    ],
)
def test_fields_the_head_cannot_honour_are_refused(change, message):
    with pytest.raises(HeadLoadError, match=message):
        head_config({**LLAMA31_EAGLE3, **change}, TARGET)


def test_bias_flags_without_biases_in_the_file_are_refused(tiny, tmp_path):
    model = tiny("tiny_llama").target
    save_head(random_head(model, "eagle3", layer_ids=[1, 2, 3]), tmp_path / "h")
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**raw, "attention_bias": True}))
    with pytest.raises(HeadLoadError, match=r"midlayer\.self_attn\.q_proj\.bias.*attention_bias"):
        load_head(str(tmp_path / "h"), model)


# --- export: what EAGLE's own loader needs ------------------------------------------------------------------


def _eagle3_reference_shapes(raw: dict) -> dict[str, tuple]:
    """The state dict of EAGLE-3's Model (SafeAILab/EAGLE eagle/model/cnets.py; SpecForge's
    LlamaForCausalLMEagle3 uses the same names) for a config: parameter and persistent-buffer names with
    their shapes. Its rotary caches are not persistent; d2t / t2d are deleted when the vocabularies are equal
    (eagle/model/ea_model.py)."""
    hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
    kv, inter, vocab = raw.get("num_key_value_heads") or heads, raw["intermediate_size"], raw["vocab_size"]
    draft_vocab = raw["draft_vocab_size"]
    head_dim = raw.get("head_dim") or hidden // heads
    shapes = {
        "embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (draft_vocab, hidden),
        "fc.weight": (hidden, 3 * raw.get("target_hidden_size", hidden)),
        "norm.weight": (hidden,),
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
    }
    if draft_vocab != vocab:
        shapes.update({"d2t": (draft_vocab,), "t2d": (vocab,)})
    return shapes


def _eagle_strict_load(directory) -> tuple[list, list, list]:
    """EAGLE's loading of a head directory, made strict: (missing, unexpected, wrongly shaped) keys.

    EAGLE builds the Model from config.json, copies the target's embed_tokens into it only when the config
    has no `target_hidden_size` (Model.__init__ with load_emb=True), then loads the file with strict=False;
    here a key neither the file nor the target supplies is reported instead of left random."""
    from safetensors import safe_open

    raw = json.loads((directory / "config.json").read_text())
    expected = _eagle3_reference_shapes(raw)
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        found = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    from_target = set() if "target_hidden_size" in raw else {"embed_tokens.weight"}
    missing = sorted(set(expected) - set(found) - from_target)
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
    return missing, unexpected, wrong


@pytest.mark.parametrize("layout,draft_vocab", [("eagle", None), ("eagle", 100), ("specforge", 100)])
def test_exported_heads_load_completely_in_eagles_layout(tiny, tmp_path, layout, draft_vocab):
    model = tiny("tiny_llama").target
    head = random_head(model, "eagle3", seed=2, layer_ids=[1, 2, 3], draft_vocab=draft_vocab)
    save_head(head, tmp_path / "h", layout)
    assert _eagle_strict_load(tmp_path / "h") == ([], [], [])


def test_a_narrow_head_exports_its_own_embeddings(tmp_path):
    from safetensors.torch import load_file

    head = _randomized(head_config(CONFIGS["llama33_narrow"], TARGET))
    save_head(head, tmp_path / "h")
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    assert raw["target_hidden_size"] == TARGET_HIDDEN and raw["hidden_size"] == 48
    assert _eagle_strict_load(tmp_path / "h") == ([], [], [])
    state = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert torch.equal(state["embed_tokens.weight"], head.embed_tokens.weight)
    # and it comes back with its own table, which the source then embeds tokens with
    target = SimpleNamespace(config=TARGET, lm_head=None, device="cpu", dtype=torch.float32)
    loaded = load_head(str(tmp_path / "h"), target)
    assert loaded.embedder(None) is loaded.embed_tokens
    assert torch.equal(loaded.embed_tokens.weight, head.embed_tokens.weight)


def test_the_shipped_head_loads_completely_in_eagles_layout():
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "heads" / "smollm2_135m_eagle3"
    assert _eagle_strict_load(shipped) == ([], [], [])


def test_the_strict_loader_catches_a_config_that_hides_the_embeddings(tiny, tmp_path):
    """The control: the earlier export named target_hidden_size (equal to hidden_size) with no embed_tokens
    in the file, which EAGLE then leaves random."""
    model = tiny("tiny_llama").target
    save_head(random_head(model, "eagle3", layer_ids=[1, 2, 3], draft_vocab=100), tmp_path / "h")
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**raw, "target_hidden_size": raw["hidden_size"]}))
    assert _eagle_strict_load(tmp_path / "h") == (["embed_tokens.weight"], [], [])


# --- Graft's attach=leaves ------------------------------------------------------------------------------------


def _retrievers(names: list[str], vocab: int = 50):
    """Retrievers as method.retrieval builds them; the recycling table says every token t is followed by t + 1."""
    from baselines.pld import PLDParams, PromptLookup
    from baselines.recycling import RecyclingParams, RecyclingRetriever
    from baselines.suffix import SuffixParams, SuffixRetriever

    target = SimpleNamespace(vocab_size=vocab, device="cpu", ops=Ops())
    built = []
    for name in names:
        if name == "recycling":
            retriever = RecyclingRetriever(RecyclingParams(), target, budget=16)
            retriever.recycler.table.rows[:, 0] = torch.arange(1, vocab + 1).clamp(max=vocab - 1)
        elif name == "suffix":
            retriever = SuffixRetriever(SuffixParams(), target, budget=16)
            retriever.reset(None)
        else:
            retriever = PromptLookup(PLDParams(), target, budget=16)
            retriever.reset(None)
        built.append(retriever)
    return built


def _leaves(room: int, tokens, parents, scores, retrieval, committed, leaf_count: int = 4):
    from graft.drafter import SequenceState
    from graft.grafting import Grafted
    from graft.methods.attach_policies import AtLeaves, LeafParams
    from graft.parts import Retrieval
    from graft.tree import DraftTree

    draft = DraftTree(torch.tensor(tokens), torch.tensor(parents), scores=torch.tensor(scores))
    grafted = Grafted(draft, room)
    AtLeaves(LeafParams(leaf_count=leaf_count)).place(
        grafted, Retrieval(_retrievers(retrieval), SequenceState(committed, 1))
    )
    return grafted


def test_leaves_of_a_chain_fill_the_budget():
    """A 3-node draft chain (one leaf) with room 10: the leaf takes all 10 (the earlier policy also chose the
    internal node to make up leaf_count, and its chain merged away: 5 of 10 filled)."""
    out = _leaves(10, [10, 11, 12], [-1, 0, 1], [0.0, -0.1, -0.2], ["recycling"], [3, 10])
    assert out.room == 0 and out.added == 10
    assert out.tree.tokens.tolist() == list(range(10, 23))
    assert out.tree.parents.tolist() == list(range(-1, 12))


def test_leaves_split_the_budget_over_real_leaves_best_first():
    # root 10 -> 11 -> 12 (leaf, -0.3) ; root -> 20 (leaf, -1.0): two leaves for leaf_count 4, room 7 -> 4 + 3
    out = _leaves(7, [10, 11, 12, 20], [-1, 0, 1, 0], [0.0, -0.1, -0.3, -1.0], ["recycling"], [3, 10])
    assert out.added == 7
    assert out.tree.tokens.tolist() == [10, 11, 12, 20, 13, 14, 15, 16, 21, 22, 23]
    assert out.tree.parents.tolist() == [-1, 0, 1, 0, 2, 4, 5, 6, 3, 8, 9]


COMMITTED = [1, 2, 3, 4, 9, 1, 2]  # the root is the last 2; the draft continues it with 3


@pytest.mark.parametrize(
    "retrieval,tokens,parents",
    [
        # suffix: "1 2 3" occurred at the start and went on with 4 9 1 2
        (["suffix"], [2, 3, 4, 9, 1, 2], [-1, 0, 1, 2, 3, 4]),
        # prompt lookup over text + path: the latest "1 2 3" is the same one, and the text after it runs on
        # into the path (4 9 1 2 3)
        (["pld"], [2, 3, 4, 9, 1, 2, 3], [-1, 0, 1, 2, 3, 4, 5]),
        # the recycling table: 3 -> 4 -> 5 -> ...
        (["recycling"], [2, 3, 4, 5, 6, 7, 8, 9], [-1, 0, 1, 2, 3, 4, 5, 6]),
        # suffix first (4 9 1 2), then recycling fills the leaf's rest: 4 merges, 5 6 below it
        (["suffix", "recycling"], [2, 3, 4, 9, 1, 2, 5, 6], [-1, 0, 1, 2, 3, 4, 2, 6]),
        # recycling first fills the leaf's share; suffix finds nothing left to add
        (["recycling", "suffix"], [2, 3, 4, 5, 6, 7, 8, 9], [-1, 0, 1, 2, 3, 4, 5, 6]),
    ],
)
def test_leaves_read_below_the_leaf_with_the_chosen_retrievers(retrieval, tokens, parents):
    out = _leaves(6, [2, 3], [-1, 0], [0.0, -0.1], retrieval, COMMITTED)
    assert out.tree.tokens.tolist() == tokens and out.tree.parents.tolist() == parents


def test_suffix_continuation_after_a_path_agrees_with_brute_force():
    import random

    from graft.retrieval.suffix import SuffixAutomaton

    rng = random.Random(0)
    for _ in range(200):
        text = [rng.randint(0, 3) for _ in range(rng.randint(1, 30))]
        extra = [rng.randint(0, 3) for _ in range(rng.randint(1, 4))]
        sam = SuffixAutomaton()
        sam.extend(text)
        whole = text + extra
        want = (0, [])
        for length in range(len(whole), 0, -1):  # the longest suffix of text + extra inside the text, first place
            suffix = whole[len(whole) - length :]
            starts = [s for s in range(len(text) - length + 1) if text[s : s + length] == suffix]
            if starts:
                want = (length, text[starts[0] + length : starts[0] + length + 5])
                break
        assert sam.continuation_after(extra, 5) == want, (text, extra)


def test_attach_leaves_reads_the_retrieval_setting(tiny):
    """End to end on a tiny model: with attach=leaves, adding suffix retrieval to recycling changes the trees
    (the earlier policy read only the first recycling-like retriever, so both runs were identical)."""
    from conftest import make_drafter

    from graft.decode import generate

    model = tiny("tiny_llama")
    prompt = list(range(5, 40)) * 2
    nodes = {}
    for retrieval in (["recycling"], ["suffix", "recycling"]):
        drafter = make_drafter("graft", model.target, attach="leaves", retrieval=retrieval, total_tokens=24)
        out = generate(model.target, drafter, prompt, 32, set())
        nodes[tuple(retrieval)] = [(i["draft_nodes"], i["retrieved_nodes"], i["merged_nodes"]) for i in out.step_info]
        assert max(out.nodes) <= 24
    assert nodes[("recycling",)] != nodes[("suffix", "recycling")]


# --- python -m graft.report check-lossless: one rule for the head -----------------------------------------------


def test_check_lossless_takes_each_head_from_the_validated_config():
    from graft.report.lossless import head_of, method_configs

    heads = {
        n: head_of(c) for n, c in method_configs(["eagle3", "graft", "pld"], ["model.draft_head=random"], []).items()
    }
    assert heads == {"eagle3": "random", "graft": "random", "pld": None}
    assert head_of(method_configs(["eagle3"], [], ["method.head=random"])["eagle3"]) == "random"
    assert head_of(method_configs(["eagle3"], [], [])["eagle3"]) == "heads/smollm2_135m_eagle3"


def test_check_lossless_does_not_resume_a_check_of_other_heads(tmp_path):
    from graft.report.lossless import _earlier_results

    fresh = {"model": "m", "max_new_tokens": 8, "overrides": [], "base": [], "heads": {"eagle3": "random"}}
    old = {
        **fresh,
        "heads": {"eagle3": "heads/x"},
        "datasets": {"builtin": {"eagle3": {}}},
        "checked": {"builtin": ["p"]},
    }
    (tmp_path / "r.json").write_text(json.dumps(old))
    assert _earlier_results(tmp_path / "r.json", fresh, ["eagle3"]) == {"datasets": {}, "checked": {}}
    (tmp_path / "r.json").write_text(json.dumps({**old, "heads": fresh["heads"]}))
    assert _earlier_results(tmp_path / "r.json", fresh, ["eagle3"])["checked"] == {"builtin": ["p"]}
