"""The memory plan (graft/plan/memory.py, with sizes, drafters, placement, capacity, fit and jobs beside it):
parameter counts against published figures, byte plans against hand computations, each part placed on the GPU
where it lives, the refusal's figures, and `python run.py model=qwen3_235b` refused in seconds on a CPU."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import compose

from graft.config.experiment import validate
from graft.config.schema import HardwareConfig
from graft.config.shapes import ModelShape, check_declared_shape, count_parameters
from graft.cpu.layout import narrow_panels_expected
from graft.cpu.products import onednn_packs
from graft.plan.capacity import available_ram, cpu_capacity, cuda_capacity
from graft.plan.fit import check, needs_text
from graft.plan.hardware import check_memory
from graft.plan.jobs import host_memory_gb, reference_gpus
from graft.plan.memory import plan_memory
from graft.plan.placement import gpus_needed, gpus_needed_like, layer_split, place
from graft.plan.sizes import attention_mask_bytes, random_model_config
from graft.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]

LLAMA31_8B = {  # meta-llama/Llama-3.1-8B-Instruct's config.json (the fields the plan reads)
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}
QWEN3_235B = {  # Qwen/Qwen3-235B-A22B's config.json
    "model_type": "qwen3_moe",
    "num_hidden_layers": 94,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 12288,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1536,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
}


def config(*overrides: str):
    return validate(compose([*overrides, "logger=none"]))


@pytest.mark.parametrize("raw,published", [(LLAMA31_8B, 8.03e9), (QWEN3_235B, 235e9)])
def test_parameter_counts_match_the_published_figures(raw, published):
    assert count_parameters(ModelShape.from_hf_config(raw)) == pytest.approx(published, rel=0.01)


def test_the_exact_counts_by_hand():
    # Llama-3.1-8B: embeddings and LM head 128256*4096 each; per layer q,o 4096*4096, k,v 4096*1024,
    # MLP 3*4096*14336, two norms; the final norm
    llama = 2 * 128256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert count_parameters(ModelShape.from_hf_config(LLAMA31_8B)) == llama == 8_030_261_248
    # Qwen3-235B: q,o 4096*(64*128), k,v 4096*(4*128), q/k norms 2*128, 128 experts 3*4096*1536, router 4096*128
    per_layer = 2 * 4096 * 8192 + 2 * 4096 * 512 + 2 * 128 + 128 * 3 * 4096 * 1536 + 4096 * 128 + 2 * 4096
    qwen = 2 * 151936 * 4096 + 94 * per_layer + 4096
    assert count_parameters(ModelShape.from_hf_config(QWEN3_235B)) == qwen == 235_093_634_560


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_moe"])
def test_counts_equal_the_parameters_transformers_builds(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = random_model_config(config(f"model={name}", "method=ar").model)
    model_type = hf_config.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **hf_config))
    built = sum(p.numel() for p in model.parameters())
    assert count_parameters(ModelShape.from_hf_config({**hf_config, "model_type": model_type})) == built


def test_the_model_configs_declare_the_published_shapes():
    for name, raw in [("llama31_8b", LLAMA31_8B), ("qwen3_235b", QWEN3_235B)]:
        assert config(f"model={name}", "method=ar").model.shape == raw
    assert config("model=qwen3_235b", "method=ar").model.fp8_path == "Qwen/Qwen3-235B-A22B-FP8"


def test_llama31_8b_plan_by_hand():
    plan = plan_memory(config("model=llama31_8b", "method=graft", "hardware=cpu_plain", "dataset=mt_bench"), "cpu")
    # the default prompt allowance (MT-Bench states no length) + run.max_new_tokens + graft's 60 tree nodes + 8
    tokens = 8192 + 64 + 60 + 8
    assert plan.kv_tokens == tokens and plan.dtype == "bfloat16"
    assert plan.weights == 8_030_261_248 * 2
    assert plan.kv_cache == 2 * 32 * 8 * 128 * 2 * tokens  # k and v, layers, kv heads, head_dim, bf16 bytes
    # EAGLE-3 head at the target's width: fc 3h*h, attention from 2h (32 + 2*8 heads of 128) and o, MLP,
    # three norms, final norm, lm_head over 32,000 draft tokens; its one layer's KV cache
    head = 3 * 4096 * 4096 + 8192 * 48 * 128 + 4096 * 4096 + 3 * 4096 * 14336 + 3 * 4096 + 4096 + 4096 * 32000
    assert plan.draft_head == head * 2 + 2 * 8 * 128 * 2 * tokens
    assert plan.tree_logits == 60 * 128256 * 4  # [tree nodes, vocab] float32
    assert plan.prefill_logits == 1 * 128256 * 4  # graft's cold start reads the last position only
    # one layer's working set over a 4,096-token chunk (hardware.prefill_chunk) of the 8,192-token prompt
    assert plan.activations == 4096 * (2 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) * 2
    assert plan.masks == 4096 * tokens * (1 + 2)  # a later chunk's mask: bool + additive bf16, [chunk, context]
    assert plan.weight_layouts == 0  # cpu_plain: transformers' own forward, no extra layouts
    parts = plan.weights + plan.kv_cache + plan.draft_head + plan.tree_logits + plan.prefill_logits
    assert plan.total == parts + plan.activations + plan.masks
    assert round(plan.total / 1e9, 1) == 18.7


def test_qwen3_235b_plan_by_hand():
    plan = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=cpu_plain", "dataset=mt_bench"), "cpu")
    tokens = 8192 + 64 + 60 + 8
    assert plan.weights == 235_093_634_560 * 2
    assert plan.kv_cache == 2 * 94 * 4 * 128 * 2 * tokens
    head = 3 * 4096 * 4096 + 8192 * (64 + 8) * 64 + 4096 * 4096 + 3 * 4096 * 12288 + 3 * 4096 + 4096 + 4096 * 32000
    assert plan.draft_head == head * 2 + 2 * 4 * 64 * 2 * tokens
    activations = 4096 * (2 * 4096 + 2 * 8192 + 2 * 512 + 3 * 8 * 1536) * 2  # 8 of 128 experts per token
    assert plan.activations == activations and plan.tree_logits == 60 * 151936 * 4
    assert round(plan.total / 1e9, 1) == 473.2


def test_the_cpu_fast_path_counts_its_weight_layouts():
    plan = plan_memory(config("model=llama31_8b", "method=ar", "hardware=cpu"), "cpu")  # fast_path=packed, bf16
    dense = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096  # + the LM head
    if onednn_packs(torch.bfloat16):
        assert plan.weight_layouts == dense * 2  # one packed bf16 copy beside the model's own weights
    elif narrow_panels_expected(HardwareConfig()):  # no bf16 products in oneDNN (AVX2): bf16 panels
        assert plan.weight_layouts == dense * 2 and "bfloat16 panels" in plan.breakdown()
    else:  # nor panels (no native build): a packed and a small-row copy, both float32
        assert plan.weight_layouts == dense * 2 * 4 and "float32 copies" in plan.breakdown()
    off = plan_memory(config("model=llama31_8b", "method=ar", "hardware=cpu", "hardware.native=off"), "cpu")
    assert off.weight_layouts == dense * 2 * (1 if onednn_packs(torch.bfloat16) else 4)
    assert plan.tree_nodes == 1 and plan.draft_head == 0  # the baseline alone: no tree, no head


def test_the_kv_cache_is_counted_in_its_own_dtype():
    """packed_bf16 multiplies in bfloat16 but keeps a float32 cache; hardware.cache_dtype=bfloat16 halves it."""
    kv = {
        cache: plan_memory(
            config(
                "model=smollm2_135m",
                "method=ar",
                "hardware=cpu",
                "hardware.fast_path=packed_bf16",
                f"hardware.cache_dtype={cache}",
            ),
            "cpu",
        ).kv_cache  # fmt: skip
        for cache in ("auto", "float32", "bfloat16")
    }
    per_token = 2 * 30 * 3 * 64  # keys and values, 30 layers, 3 key/value heads of 64
    assert kv["auto"] == kv["float32"] == 2 * kv["bfloat16"] and kv["bfloat16"] % (per_token * 2) == 0


# packed: oneDNN's copy and the small-row one the load-time measurements kept (W_t or the panels), and W_t for one
# row beside the panels where it measured faster there: the plan counts the three
@pytest.mark.parametrize(
    "fast_path,copies,most", [("packed", ("small", "packed", "one_row"), 3), ("transposed", ("weight_t",), 1)]
)
def test_the_weight_layouts_are_what_the_lean_backend_builds(tiny, fast_path, copies, most):
    lean = tiny(f"tiny_qwen3:{fast_path}").target.lean  # the model's own weights stay beside these
    linears = [lean.lm_head, *(m for layer in lean.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down))]
    layouts = [t for m in linears for name in copies if (t := getattr(m, name)) is not None]
    built = sum(t.numel() * t.element_size() for t in layouts)
    plan = plan_memory(config("model=tiny_qwen3", "method=ar", f"hardware.fast_path={fast_path}"), "cpu")
    one_copy = plan.weight_layouts // most
    kept_or_not = {one_copy * most, one_copy * (most - 1)} if fast_path == "packed" else {one_copy}  # W_t for one row
    assert built in kept_or_not and built > 0


def test_a_comparison_counts_one_head_per_method_that_drafts_with_one():
    single = plan_memory(config("model=llama31_8b", "method=eagle3", "hardware=cpu_plain"), "cpu")
    compared = plan_memory(config("model=llama31_8b", "hardware=cpu_plain", "methods=[pld,eagle3,pruned,graft]"), "cpu")
    assert (single.draft_heads, compared.draft_heads) == (1, 3)
    assert compared.draft_head == 3 * single.draft_head and "3 draft models" in compared.breakdown()


def test_a_block_drafter_is_counted_at_its_size(tiny):
    """The plan's parameters for method=dflash's random drafter equal the module's, and its cache grows with
    the context like one KV entry per layer and token."""
    from graft.draft_models.dflash.checkpoint import random_block_drafter
    from graft.plan.drafters import block_drafter_size
    from graft.plan.sizes import model_shape

    cfg = config("model=tiny_qwen3", "method=dflash", "method.random_layers=2")
    shape, _ = model_shape(cfg.model)
    params, kv_per_token, note = block_drafter_size(cfg.method.flat(), shape)
    built = random_block_drafter(tiny("tiny_qwen3").target, num_layers=2)
    assert params == sum(p.numel() for p in built.parameters()) and note.startswith("block drafter")
    assert kv_per_token == 2 * 2 * built.cfg.num_kv_heads * built.cfg.head_dim
    plan = plan_memory(cfg, "cpu")
    assert plan.draft_heads == 1 and plan.draft_head == (params + kv_per_token * plan.kv_tokens) * 4


def test_the_prompt_allowance_follows_the_dataset_and_the_context():
    long_cfg = config("model=qwen3_8b", "method=ar", "dataset=long_synthetic", "dataset.lengths=[4096,16384]")
    long = plan_memory(long_cfg, "cpu")
    assert long.kv_tokens == 16384 + 64 + 1 + 8 and "dataset.lengths" in long.kv_tokens_note
    capped = plan_memory(config("model=vicuna_7b", "method=ar", "dataset=mt_bench"), "cpu")  # 2,048-token context
    assert capped.kv_tokens == (2048 - 64) + 64 + 1 + 8 and "context 2,048" in capped.kv_tokens_note


def test_the_builtin_prompts_are_bounded_by_their_bytes():
    plan = plan_memory(config("model=qwen3_8b", "method=graft"), "cpu")  # builtin_quick, the default
    longest = 633 + 61 + 64  # sum-2: two user turns of 633 and 61 UTF-8 bytes, one earlier answer of 64 tokens
    assert plan.kv_tokens == longest + 256 + 64 + 60 + 8 and "built-in" in plan.kv_tokens_note


def test_a_refusal_names_what_is_needed_and_offered():
    plan = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=cpu_plain", "dataset=mt_bench"), "cpu")
    with pytest.raises(ConfigError) as refused:
        check(plan, cpu_capacity(24 * 10**9))
    message = str(refused.value)
    assert "model=qwen3_235b needs about 473.2 GB" in message and "GB = 1e9 bytes" in message
    assert "weights 470.2 GB" in message and "KV cache 1.6 GB for 8,324 tokens" in message
    assert "this machine offers 24.0 GB (CPU RAM available)" in message
    assert "4 H200 (150.1 GB) or 7 H100/A100 80GB (85.0 GB)" in message and "model.num_gpus=auto" in message
    assert "run.skip_memory_check=true" in message and "\n" not in message  # run.py prints one line


def test_too_few_gpus_and_too_little_gpu_memory_are_refused():
    pinned = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=gpu", "model.num_gpus=4"), "cuda")
    with pytest.raises(ConfigError, match=r"asks for 4 GPUs .* this machine shows 1 "):
        check(pinned, cuda_capacity([141 * 10**9], gpus_visible=1))
    plan = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=gpu", "dataset=mt_bench"), "cuda")
    with pytest.raises(ConfigError) as refused:  # 94 layers over 3 GPUs: 32, 31, 31 of 4.98 GB each
        check(plan, cuda_capacity([141 * 10**9] * 3, gpus_visible=4))
    message = str(refused.value)
    assert message.startswith("model=qwen3_235b overflows GPU 0 (of 3 used) by 34.6 GB: it needs 161.5 GB there")
    assert "32 layers 159.2 GB" in message and "GPU 0 offers 126.9 GB (141.0 GB free less 10% headroom)" in message
    assert "also over: GPU 1 by 28.4 GB, GPU 2 by 31.7 GB" in message  # GPU 2: the drafting embeddings too
    assert "It needs about 4 GPUs with 141.0 GB free like this machine's" in message and "\n" not in message
    check(plan, cuda_capacity([141 * 10**9] * 4, gpus_visible=4))  # 24, 24, 23, 23 layers: 121.7 GB at most


def test_the_layers_split_as_accelerate_balances_them():
    assert layer_split(94, 4) == [24, 24, 23, 23] and layer_split(32, 1) == [32] and layer_split(80, 2) == [40, 40]
    assert layer_split(32, 3) == [11, 11, 10]


def test_each_part_lives_on_its_gpu():
    """Layers and their cache split over the GPUs, the embeddings on the first, the LM head, draft models and
    logits on the last, a prefill chunk's activations and the attention mask on each; nothing lost."""
    plan = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=gpu", "dataset=mt_bench"), "cuda")
    first, middle, _, last = place(plan, 4)
    layer = 2 * (2 * 4096 * 8192 + 2 * 4096 * 512 + 2 * 128 + 128 * 3 * 4096 * 1536 + 4096 * 128 + 2 * 4096)
    assert first.parts["24 layers"] == 24 * layer and last.parts["23 layers"] == 23 * layer
    assert first.parts["KV cache"] == 24 * 2 * 4 * 128 * 2 * 8324  # its layers' keys and values, bf16
    assert first.parts["embeddings"] == 151936 * 4096 * 2 and "embeddings" not in last.parts
    assert last.parts["LM head"] == (4096 + 151936 * 4096) * 2 and "LM head" not in middle.parts
    assert last.parts["draft model"] == plan.draft_head and last.parts["verification logits"] == 60 * 151936 * 4
    for share in (first, middle, last):
        assert share.parts["prefill activations"] == plan.activations and share.parts["attention mask"] == plan.masks
    assert last.parts["drafting embeddings"] == first.parts["embeddings"]  # drafting embeds on the LM head's GPU
    assert sum(share.total for share in place(plan, 4)) == plan.total + 3 * (plan.activations + plan.masks) + (
        plan.embedding_weights
    )
    (one,) = place(plan, 1)
    assert one.total == plan.total  # one GPU holds the whole plan


def test_the_mask_and_the_prefill_logits():
    assert attention_mask_bytes(rows=60, context=1000, dtype_bytes=2) == 60 * 1000 * 3  # bool and bf16 additive
    plan = plan_memory(config("model=llama31_8b", "method=graft", "dataset=mt_bench", "hardware=gpu"), "cuda")
    paper = plan_memory(
        config("model=llama31_8b", "method=graft", "method.cold_start=prefill", "dataset=mt_bench", "hardware=gpu"),
        "cuda",
    )
    assert plan.prefill_logit_rows == 1 and plan.prefill_logits == 128256 * 4
    assert paper.prefill_logit_rows == 4096 and paper.prefill_logits == 4096 * 128256 * 4  # top-k at every position
    short = plan_memory(config("model=llama31_8b", "method=graft", "hardware=gpu"), "cuda")  # 1,014-token prompts
    assert short.prefill_rows == 1014 and short.mask_rows == 60  # one chunk, causal without a mask: the tree's


def test_the_gpu_count_is_the_smallest_whose_every_gpu_fits():
    qwen = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=gpu", "dataset=mt_bench"), "cuda")
    assert gpus_needed_like(qwen, 141 * 10**9) == 4 and gpus_needed_like(qwen, 80 * 10**9) == 7
    assert gpus_needed(qwen, [141 * 10**9] * 3) is None  # three are not enough
    llama = plan_memory(config("model=llama31_8b", "method=graft", "hardware=gpu", "dataset=mt_bench"), "cuda")
    assert gpus_needed(llama, [80 * 10**9]) == 1
    check(llama, cuda_capacity([80 * 10**9], gpus_visible=1))


def test_the_total_fits_but_the_last_gpu_overflows():
    """Llama-3.1-8B with three EAGLE-3 heads on two GPUs of 12 GB free (10.8 GB usable each): 20.3 GB in all
    fits 21.6 GB, but the second GPU holds 16 layers, the LM head, the three heads and the drafting embeddings:
    12.8 GB (masks: the [60, 60] tree block only)."""
    cfg = config("model=llama31_8b", "methods=[eagle3,pruned,graft]", "hardware=gpu_multi", "dataset=mt_bench")
    plan = plan_memory(cfg, "cuda")
    capacity = cuda_capacity([12 * 10**9] * 2, gpus_visible=2)
    assert plan.total <= capacity.usable
    first, last = place(plan, 2)
    assert first.total <= capacity.usable_on(0) == capacity.usable_on(1) < last.total
    with pytest.raises(ConfigError, match=r"overflows GPU 1 \(of 2 used\) by 2\.0 GB: it needs 12\.8 GB there"):
        check(plan, capacity)
    assert gpus_needed(plan, [12 * 10**9] * 3) == 3  # a third GPU takes layers off the last


def test_cuda_capacity_counts_the_gpus_the_model_will_use(monkeypatch):
    import torch

    from graft.plan.capacity import machine_capacity

    asked = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: asked.append(i) or (100 * 10**9, 141 * 10**9))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    one, sharded, parallel = (machine_capacity("cuda", p) for p in ("one", "sharded", "tensor_parallel"))
    assert (one.offered, sharded.offered, parallel.offered) == (100 * 10**9, 200 * 10**9, 400 * 10**9)
    assert sharded.usable == 180 * 10**9 and sharded.gpus_visible == 2 and sharded.usable_on(1) == 90 * 10**9
    assert asked == [0, 0, 1, 1]  # tensor parallel: only this process's GPU
    first = machine_capacity("cuda", "sharded", num_gpus=1)  # model.num_gpus=1: the first GPU only
    assert first.free_per_gpu == (100 * 10**9,) and first.gpus_visible == 2


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_moe", "smollm2_135m"])
def test_small_models_pass_on_this_machine(name):
    cfg = config(f"model={name}", "method=graft")
    plan = check_memory(cfg)  # this machine: no refusal
    assert plan.known and plan.total < (3e9 if name == "smollm2_135m" else 0.1e9)
    check(plan, cpu_capacity(3 * 10**9))


def test_unknown_shapes_are_not_checked_and_the_escape_hatch_skips_the_check(tmp_path):
    plan = plan_memory(config("model=pretrained", "methods=[pld]", f"model.path={tmp_path}/none"), "cpu")
    assert not plan.known and "unknown shape, not checked" in plan.breakdown()
    check(plan, cpu_capacity(0))
    assert check_memory(config("model=qwen3_235b", "method=graft", "run.skip_memory_check=true")) is None


def test_a_local_checkpoint_config_takes_the_place_of_the_declared_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B))
    plan = plan_memory(config("model=qwen3_8b", "method=ar", f"model.path={tmp_path}", "hardware=cpu_plain"), "cpu")
    assert plan.params == 8_030_261_248 and plan.shape_source.endswith("config.json")


def test_a_misspelt_shape_key_is_refused():
    with pytest.raises(ConfigError, match="did you mean 'num_hidden_layers'"):
        check_declared_shape({**LLAMA31_8B, "num_hiden_layers": 32})
    with pytest.raises(ConfigError, match="no vocab_size"):
        check_declared_shape({k: v for k, v in LLAMA31_8B.items() if k != "vocab_size"})


def test_the_cli_refuses_qwen3_235b_in_seconds():
    available, _ = available_ram()
    if available is not None and available > 600e9:
        pytest.skip("this machine has the RAM to load Qwen3-235B: nothing to refuse")
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}  # no download even if the check failed
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "run.py", "model=qwen3_235b", "method=graft", "logger=none", "run.progress=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    elapsed = time.perf_counter() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "needs about" in proc.stderr and "GB" in proc.stderr and "Traceback" not in output
    assert elapsed < 60


# --- run.batch_size: B slots (docs/batching.md, "Memory and SLURM at batch B") ---------------------------------------

LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # k and v, 32 layers, 8 kv heads, head_dim 128, bf16 bytes
LLAMA_HEAD_KV_PER_TOKEN = 2 * 8 * 128 * 2  # the EAGLE-3 head's one layer
# the EAGLE-3 head estimated at Llama-3.1-8B's width (test_llama31_8b_plan_by_hand)
LLAMA_HEAD = 3 * 4096 * 4096 + 8192 * 48 * 128 + 4096 * 4096 + 3 * 4096 * 14336 + 3 * 4096 + 4096 + 4096 * 32000
LLAMA_ACTIVATIONS = 4096 * (2 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) * 2  # a 4,096-token prefill chunk
H200_USABLE = 150.1e9 * (1 - 0.10)  # the reference H200, 10% kept as headroom


def test_at_batch_8_the_kv_cache_logits_masks_and_draft_caches_are_8_slots():
    one, eight = (
        plan_memory(
            config("model=llama31_8b", "method=graft", "hardware=gpu", "dataset=mt_bench", f"run.batch_size={b}"),
            "cuda",
        )
        for b in (1, 8)
    )
    tokens = 8192 + 64 + 60 + 8  # one slot: the prompt allowance + new tokens + graft's 60 nodes + 8
    assert one.kv_tokens == eight.kv_tokens == tokens and (one.batch_size, eight.batch_size) == (1, 8)
    assert one.kv_cache == LLAMA_KV_PER_TOKEN * tokens and eight.kv_cache == 8 * LLAMA_KV_PER_TOKEN * tokens
    assert eight.tree_logits == 8 * 60 * 128256 * 4 == 8 * one.tree_logits
    assert one.masks == 60 * 60 * 3  # batch 1 on the GPU: the compact [60, 60] tree mask, bool + bf16
    assert eight.masks == 8 * 60 * tokens * 2  # the batched verify's [8, 1, 60, capacity] additive bf16 mask
    assert one.draft_head == LLAMA_HEAD * 2 + LLAMA_HEAD_KV_PER_TOKEN * tokens
    assert eight.draft_head == LLAMA_HEAD * 2 + 8 * LLAMA_HEAD_KV_PER_TOKEN * tokens  # weights once, 8 caches
    assert eight.draft_kv == 8 * LLAMA_HEAD_KV_PER_TOKEN * tokens
    for same in ("weights", "activations", "prefill_logits", "prefill_rows"):  # a newcomer prefills alone
        assert getattr(eight, same) == getattr(one, same), same
    weights, prefill = 8_030_261_248 * 2 + LLAMA_HEAD * 2, 128256 * 4 + LLAMA_ACTIVATIONS
    slot = (LLAMA_KV_PER_TOKEN + LLAMA_HEAD_KV_PER_TOKEN) * tokens + 60 * 128256 * 4
    assert eight.total == weights + prefill + 8 * slot + eight.masks
    assert eight.total == one.total + 7 * (
        LLAMA_KV_PER_TOKEN * tokens + 60 * 128256 * 4 + LLAMA_HEAD_KV_PER_TOKEN * tokens
    ) + (eight.masks - one.masks)
    assert host_memory_gb(eight) == host_memory_gb(one) == 64  # draft caches live on the GPU
    text = needs_text(eight)
    assert text.startswith(f"model=llama31_8b at run.batch_size=8 needs about {eight.total / 1e9:.1f} GB")
    assert f"KV cache 8.7 GB for 8 x {tokens:,} tokens (run.batch_size=8 slots of 8,192 prompt" in text
    assert "(8 x 60 tree nodes)" in text and f"(8 x 60 x {tokens:,})" in text and "caches for 8 slots" in text
    assert needs_text(one).startswith("model=llama31_8b needs about") and "run.batch_size" not in needs_text(one)
    assert f"KV cache 1.1 GB for {tokens:,} tokens (8,192 prompt" in needs_text(one)


def test_a_batched_plan_lives_on_one_gpu():
    sharded = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=gpu"), "cuda")  # model.device_map=auto
    batched = plan_memory(config("model=qwen3_235b", "method=graft", "hardware=gpu", "run.batch_size=2"), "cuda")
    assert (sharded.placement, batched.placement) == ("sharded", "one")


def paper_long_llama(batch: int):
    return config("experiment=paper_long", "model=llama31_8b", f"run.batch_size={batch}")


def test_a_model_that_fits_one_h200_at_batch_1_needs_three_at_batch_32_and_its_job_is_refused():
    """paper_long's Llama-3.1-8B: 64K-token prompts, three EAGLE-3 heads (eagle3, pruned, graft). At B = 32 its
    KV cache no longer fits one H200; a batched run decodes on one GPU, so the SLURM job is refused, naming the
    largest B that fits one."""
    tokens = 65536 + 1024 + 60 + 8
    fixed = 8_030_261_248 * 2 + 3 * LLAMA_HEAD * 2 + 128256 * 4 + LLAMA_ACTIVATIONS  # weights, heads, prefill
    per_slot = (LLAMA_KV_PER_TOKEN + 3 * LLAMA_HEAD_KV_PER_TOKEN) * tokens + 60 * 128256 * 4 + 60 * tokens * 2
    one, batched = plan_memory(paper_long_llama(1), "cuda"), plan_memory(paper_long_llama(32), "cuda")
    assert batched.total == fixed + 32 * per_slot  # compact masks on the GPU: no prefill chunk's mask
    assert gpus_needed_like(one, 150.1e9) == 1
    assert host_memory_gb(batched) == host_memory_gb(one) == 64  # 28.7 GB of draft caches at B = 32 are on GPUs
    assert gpus_needed_like(batched, 150.1e9) == math.ceil(batched.total / H200_USABLE) == 3
    fits = int((H200_USABLE - fixed) // per_slot)
    assert fits == 12 and reference_gpus(paper_long_llama(fits)) == 1
    with pytest.raises(ConfigError) as refused:
        reference_gpus(paper_long_llama(32))
    message = str(refused.value)
    assert message.startswith("run.batch_size=32 does not fit one GPU with 150.1 GB (135.1 GB after keeping 10%")
    assert f"run.batch_size={fits} is the most that fits one" in message and "\n" not in message
    assert "KV cache 279.5 GB for 32 x 66,628 tokens" in message
    with pytest.raises(ConfigError, match="not even one sequence fits one"):  # 470 GB of weights: batch 1 only
        reference_gpus(config("experiment=paper_large", "model=qwen3_235b", "run.batch_size=2"))


def test_a_batch_this_machine_cannot_hold_is_refused_naming_the_batch_size_that_fits(monkeypatch):
    import graft.plan.capacity as capacity

    monkeypatch.setattr(capacity, "available_ram", lambda: (40 * 10**9, "CPU RAM available, /proc/meminfo"))
    cfg = config("model=llama31_8b", "method=ar", "hardware=cpu_plain", "dataset=mt_bench", "run.batch_size=32")
    assert check_memory(config("model=llama31_8b", "method=ar", "hardware=cpu_plain", "dataset=mt_bench")).known
    with pytest.raises(ConfigError) as refused:
        check_memory(cfg)
    message = str(refused.value)
    # one slot: 8,265 tokens of 131,072 bytes and the baseline's 1-node logits; once: 16.1 GB of weights and a
    # newcomer's prefill chunk (its logits, activations, and its [4,096, 8,265] mask, larger than 32 verify rows')
    tokens = 8192 + 64 + 1 + 8
    slot = LLAMA_KV_PER_TOKEN * tokens + 128256 * 4
    fixed = 8_030_261_248 * 2 + 128256 * 4 + LLAMA_ACTIVATIONS + 4096 * tokens * 3
    fits = int((40 * 10**9 - fixed) // slot)
    assert fits == 21 and f"attention masks 0.1 GB (4,096 x {tokens:,})" in message
    assert message.startswith("model=llama31_8b at run.batch_size=32 needs about") and "\n" not in message
    said = "run.batch_size=32 decodes on one device (a batched run does not shard the model)"
    assert f"{said}: run.batch_size={fits} is the most that fits here" in message
    assert "this machine offers 40.0 GB" in message and "run.skip_memory_check=true" in message
