"""The bytes each part of a run takes, before anything loads: the target's shape and where it came from
(model_shape), the dtypes it runs and caches in, the positions its KV cache will hold (planned_tokens), and what a
decoder layer, the LM head, one position's keys and values, a prefill chunk's activations and the attention mask
take. GB = 1e9 bytes throughout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from graft.config.shapes import ModelShape, attention_params, mlp_params

if TYPE_CHECKING:
    from graft.config.schema import ExperimentConfig, ModelConfig


GB = 1e9  # decimal gigabytes, as GPU vendors and disk sizes state them
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_PROMPT_ALLOWANCE = 8192  # tokens, when the dataset states no prompt length
TEMPLATE_ALLOWANCE = 256  # tokens a chat template adds around a conversation (role headers, default system text)
CACHE_SLACK = 8  # decode.py sizes the target's cache as prompt + new tokens + tree nodes + 8


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """Keys and values of every layer for one position: 2 * layers * kv_heads * head_dim * bytes."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes


def prefill_activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> int:
    """An allowance for one layer's working set while the prompt is encoded: the residual and its norm,
    q/k/v and the attention output, and the MLP's gate, up and product ([tokens, width] each). Layers run
    one after another, so one layer's worth is live at a time; fused attention keeps no [n, n] scores."""
    q_width, kv_width = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    mlp_width = shape.experts_per_token * shape.moe_intermediate_size if shape.num_experts else shape.intermediate_size
    per_token = 2 * shape.hidden_size + 2 * q_width + 2 * kv_width + 3 * mlp_width
    return tokens * per_token * dtype_bytes


def kv_cache_dtype(hardware, *, run_dtype: str, loaded: str) -> str:
    """The target's key/value cache dtype: hardware.cache_dtype, or under auto the activations' (packed_bf16
    multiplies in bfloat16 but keeps the loaded dtype's activations and cache)."""
    if hardware.cache_dtype != "auto":
        return hardware.cache_dtype
    return loaded if hardware.fast_path == "packed_bf16" else run_dtype


def load_dtype(model_dtype: str, device_type: str) -> str:
    """graft/load/models._dtype: `auto` is float32 on the CPU and bfloat16 on a GPU."""
    if model_dtype == "auto":
        return "float32" if device_type == "cpu" else "bfloat16"
    return model_dtype


def planned_tokens(cfg: ExperimentConfig, shape: ModelShape, tree_nodes: int) -> tuple[int, str]:
    """Positions the target's cache will hold at most, and how that number was chosen.

    Token counts need the tokenizer, which loads with the model, so the plan takes the longest prompt the
    dataset states (dataset.lengths of a long-context set), a bound on the built-in prompts (they are in
    the code), dataset.max_prompt_tokens, else a default allowance; capped at what the context admits
    (the runner skips longer prompts)."""
    dataset = cfg.dataset
    if dataset.source in ("long_synthetic", "pg19"):
        prompt, why = max(dataset.lengths), "dataset.lengths"
    elif dataset.source == "builtin":
        prompt = builtin_prompt_bound(new_tokens=cfg.run.max_new_tokens, system_prompt=cfg.model.system_prompt)
        why = "longest built-in conversation: UTF-8 bytes + earlier answers + template"
    elif dataset.max_prompt_tokens:
        prompt, why = dataset.max_prompt_tokens, "dataset.max_prompt_tokens"
    else:
        prompt, why = DEFAULT_PROMPT_ALLOWANCE, "default prompt allowance; dataset.max_prompt_tokens sets it"
    context = cfg.model.max_context or shape.max_position_embeddings
    new = cfg.run.max_new_tokens
    if context and prompt > context - new:
        prompt, why = max(context - new, 0), f"model context {context:,} less run.max_new_tokens"
    tokens = prompt + new + tree_nodes + CACHE_SLACK
    return tokens, f"{prompt:,} prompt ({why}) + {new} new + {tree_nodes} tree + {CACHE_SLACK}"


def builtin_prompt_bound(new_tokens: int, system_prompt: str | None) -> int:
    """At most how many tokens the last turn of the longest built-in conversation takes: every user turn
    (a byte-level or byte-fallback tokenizer spends at most one token per UTF-8 byte), the earlier
    answers (at most run.max_new_tokens each), the system prompt and the template's own tokens."""
    from graft.data.builtin import (
        BUILTIN,
    )  # not at the top: only a plan for the built-in prompts reads them

    longest = max(sum(len(t.encode()) for t in p.turns) + (len(p.turns) - 1) * new_tokens for p in BUILTIN)
    return longest + len((system_prompt or "").encode()) + TEMPLATE_ALLOWANCE


def random_model_config(model: ModelConfig) -> dict | None:
    """A random model's full config as transformers builds it from arch_config (its defaults filled in)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "qwen3_moe": Qwen3MoeConfig}
    if model.architecture not in classes:
        return None  # load_model names the allowed architectures
    return classes[model.architecture](**model.arch_config).to_dict()


def model_shape(model: ModelConfig) -> tuple[ModelShape | None, str]:
    """The target's shape without loading it, and where it came from (or why it is unknown): config.json in a
    local `model.path`, the `model.shape` the model config declares (the published config.json fields), or a
    random model's `arch_config` (with transformers' defaults), in that order. Without one the plan says
    "unknown shape, not checked" and nothing is refused."""
    if model.source == "pretrained" and model.path:
        local = Path(model.path).expanduser() / "config.json"
        if local.is_file():
            try:
                return ModelShape.from_hf_config(json.loads(local.read_text())), str(local)
            except ValueError as err:  # an architecture this reader does not know: do not block the run
                return None, f"{local}: {err}"
    if model.shape is not None:
        return ModelShape.from_hf_config(model.shape), "model.shape"
    if model.source == "random":
        config = random_model_config(model)
        if config is not None:
            return ModelShape.from_hf_config(config), "model.arch_config"
    return None, "model.shape is not set"


def compact_masks(hardware) -> bool:
    """Whether forwards carry compact masks (graft/layers.py: split_attention): transformers' forward with the
    graft_sdpa attention over a growing cache; the CPU engine and static caches (hardware.compile) keep
    [rows, context] masks."""
    return hardware.attention == "graft_sdpa" and hardware.fast_path == "none" and hardware.compile == "off"


def attention_mask_bytes(rows: int, context: int, dtype_bytes: int, compact: bool = False) -> int:
    """The mask one forward carries as graft/tree.additive_mask builds it: a bool and an additive one in the
    model's dtype, [rows, context], or with compact masks the tree's own [rows, rows] (a prompt chunk has
    none). Built on the LM head's GPU, each layer's GPU gets a copy (Accelerate moves the inputs), so every
    GPU counts it."""
    return rows * (rows if compact else context) * (1 + dtype_bytes)


def planned_masks(
    hardware, batch: int, *, prompt: int, chunk: int, tree_nodes: int, tokens: int, dtype_bytes: int
) -> tuple[int, int, int]:
    """(bytes, rows, slots) of the largest attention mask a forward carries over a cache of `tokens` positions:
    a verification's over `tree_nodes` rows or a prefill chunk's, whichever is larger; at `batch` > 1 the batched
    verify's covers every slot."""
    compact = compact_masks(hardware)
    # the first chunk runs causal, without a mask; with compact masks every chunk does
    prefill_mask_rows = chunk if prompt > chunk and not compact else 0
    mask_rows, mask_slots = max(tree_nodes, prefill_mask_rows), 1
    masks = attention_mask_bytes(mask_rows, tokens, dtype_bytes, compact)
    if batch > 1:  # the batched verify's additive mask [B, 1, nodes, capacity] in the model's dtype (verify_rows)
        verify_masks = batch * tree_nodes * tokens * dtype_bytes
        prefill_masks = attention_mask_bytes(prefill_mask_rows, tokens, dtype_bytes, compact)
        masks = max(verify_masks, prefill_masks)
        mask_rows, mask_slots = (tree_nodes, batch) if verify_masks >= prefill_masks else (prefill_mask_rows, 1)
    return masks, mask_rows, mask_slots


def layer_params(shape: ModelShape) -> int:
    """One decoder layer: attention, MLP (or experts) and its two norms."""
    return attention_params(shape) + mlp_params(shape) + 2 * shape.hidden_size


def output_params(shape: ModelShape) -> int:
    """The final norm and, unless tied to the embeddings, the LM head."""
    return shape.hidden_size + (0 if shape.tie_embeddings else shape.vocab_size * shape.hidden_size)


def prefill_logit_rows(methods: list[dict], chunk: int) -> tuple[int, str]:
    """Rows of logits one prefill forward keeps: a chunk's when a method reads the successors of every
    prompt position (Token Recycling's cold_start=prefill, graft/decode.py), else the last position's."""
    if any(m.get("cold_start") == "prefill" for m in methods):
        return chunk, "every prompt position: method.cold_start=prefill"
    return 1, "the last position"
