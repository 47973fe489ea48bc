"""Memory planning before a model loads: the bytes a run needs, from the sizes its config declares, placed
where they will live, against what this machine offers, so that a run that cannot fit is refused in seconds
(with the figures) instead of after a download of hundreds of GB.

What is counted: the target's weights (parameters x bytes of the dtype, plus the extra weight layouts a
CPU fast path keeps), the KV cache of the longest prompt the run plans for + the new tokens + the draft
tree, a verification's logits [tree nodes, vocab] and the prefill's (a chunk's rows when a method reads
every prompt position, else one) in float32, one layer's activations over a prefill chunk, the attention
mask a forward carries, and the draft models (an EAGLE head: one decoder layer at the head's shape, its
fc and lm_head, its KV cache; a block drafter: its layers and cache).
At run.batch_size=B (graft/batch.py) the KV cache is B slots of the planned tokens, the verification's logits
and mask are B trees' (the mask over each slot's whole capacity), each slot's drafter has its own draft cache
(the draft weights once); a newcomer's prefill runs alone, so its logits, activations and mask stay one
chunk's. A batched run decodes on one device (it does not shard), so at B > 1 the plan is placed on one GPU.
Where: on the CPU everything in one place. On k GPUs (`place`) the layers split as Accelerate's balanced
device_map splits them (about layers / k each) with their KV cache; the embeddings on the first GPU; the
final norm, LM head, draft models, logits and a copy of the embeddings to draft with on the last (drafting
lives on the LM head's device); a prefill chunk's activations and the attention mask on every one. `check`
compares each GPU's share with that GPU's free memory, 10% kept as headroom (CUDA context, allocator
fragmentation, the library's workspaces); on the CPU the total with the RAM the kernel reports as
available. `gpus_needed` is the smallest k for which every GPU fits. GB = 1e9 bytes throughout.

The shape comes from, in order: config.json in a local `model.path`, the `model.shape` the model config
declares (the published config.json fields), or a random model's `arch_config` (with transformers'
defaults). Without one the plan says "unknown shape, not checked" and nothing is refused.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from graft.cpu.layout import fast_path_layout
from graft.schema import ConfigError
from graft.config.shapes import (  # noqa: F401 (the plan's shapes, read from here by callers and tests)
    REQUIRED_SHAPE_KEYS,
    SHAPE_KEYS,
    ModelShape,
    attention_params,
    attention_weights,
    count_parameters,
    dense_linear_params,
    mlp_params,
)

if TYPE_CHECKING:
    from graft.config.experiment import ExperimentConfig, ModelConfig

GB = 1e9  # decimal gigabytes, as GPU vendors and disk sizes state them
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CUDA_HEADROOM = 0.10  # share of each GPU's free memory left unplanned
DEFAULT_PROMPT_ALLOWANCE = 8192  # tokens, when the dataset states no prompt length
TEMPLATE_ALLOWANCE = 256  # tokens a chat template adds around a conversation (role headers, default system text)
CACHE_SLACK = 8  # decode.py sizes the target's cache as prompt + new tokens + tree nodes + 8
EAGLE3_DRAFT_VOCAB = 32000  # the draft vocabulary of the published EAGLE-3 heads
# What a refusal on a CPU machine sizes the need in: the bytes torch reports as these GPUs' total memory
# (an "80 GB" H100 or A100 holds 79.2 GiB = 85.0e9 bytes; a "141 GB" H200 139.8 GiB = 150.1e9 bytes).
REFERENCE_GPUS = (("H200", 150.1e9), ("H100/A100 80GB", 85.0e9))
# The GPU types a SLURM job may ask for (the launcher's gres or constraint, GRAFT_SLURM_GPU), by the same bytes
GPU_TYPES = {"h200": 150.1e9, "h100": 85.0e9, "a100": 85.0e9}
HOST_PROCESS_GB = 32  # host RAM of a GPU job's process itself: Python, torch, CUDA contexts, tokenizer, datasets
HOST_MEMORY_STEP_GB = 32  # a job's mem_gb rounds up to steps of this
UNKNOWN_HOST_MEMORY_GB = 64  # mem_gb for a model of unknown shape (the launcher's one figure before it was sized)


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


# --- the draft head ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadShape:
    kind: str  # "eagle3" | "eagle1"
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    draft_vocab_size: int  # eagle3: its own lm_head's rows; eagle1 shares the target's LM head
    target_hidden_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads  # as graft/draft_models/eagle/head.py builds it


def head_params(head: HeadShape) -> int:
    """One decoder layer (EAGLE-3's attention reads 2H: the embedding and the hidden state side by side)
    plus fc (3 target features -> H for EAGLE-3, [embedding; feature] 2H -> H for EAGLE-1) and EAGLE-3's
    own norm and lm_head; the token embeddings are the target's."""
    h, d = head.hidden_size, head.head_dim
    attention_in = 2 * h if head.kind == "eagle3" else h
    attention = attention_in * (head.num_heads + 2 * head.num_kv_heads) * d + head.num_heads * d * h
    layer = attention + 3 * h * head.intermediate_size + 3 * h
    if head.kind == "eagle3":
        return 3 * head.target_hidden_size * h + layer + h + h * head.draft_vocab_size
    return 2 * h * h + h + layer


def estimated_head_shape(kind: str, target: ModelShape, draft_vocab: int | None) -> HeadShape:
    """A published head is one layer at the target's width (graft/draft_models/eagle/checkpoint.py builds random heads
    the same way); EAGLE-3 heads draft over 32,000 tokens unless their config says otherwise."""
    return HeadShape(
        kind=kind,
        hidden_size=target.hidden_size,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        intermediate_size=target.intermediate_size or 4 * target.hidden_size,
        draft_vocab_size=draft_vocab or (EAGLE3_DRAFT_VOCAB if kind == "eagle3" else target.vocab_size),
        target_hidden_size=target.hidden_size,
    )


def head_shape_from_config(raw: dict, target: ModelShape) -> HeadShape:
    """A head's own config.json, read as graft/draft_models/eagle/checkpoint.head_config reads it."""
    eagle3 = "draft_vocab_size" in raw or any("Eagle3" in a for a in raw.get("architectures") or [])
    heads = raw["num_attention_heads"]
    return HeadShape(
        kind="eagle3" if eagle3 else "eagle1",
        hidden_size=raw["hidden_size"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads", heads),
        intermediate_size=raw["intermediate_size"],
        draft_vocab_size=raw.get("draft_vocab_size", target.vocab_size),
        target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
    )


def head_kind_from_name(source: str) -> str:
    """EAGLE-3 heads say so in their names (EAGLE3-LLaMA3.1-Instruct-8B, Qwen3-8B_eagle3); the others
    published for these targets are EAGLE-1/2 heads (EAGLE-Vicuna-7B-v1.3)."""
    squeezed = source.lower().replace("-", "").replace("_", "")
    return "eagle3" if "eagle3" in squeezed else "eagle1"


def draft_head_shape(method_keys: dict, target: ModelShape) -> tuple[HeadShape, str]:
    """The head a method drafts with, and where its shape came from."""
    source = method_keys["head"]
    if source == "random":  # graft/draft_models/eagle/checkpoint.random_head: the target's shape and vocabulary
        kind = method_keys.get("random_kind") or "eagle3"
        return estimated_head_shape(kind, target, draft_vocab=target.vocab_size), f"random {kind} head"
    config_path = Path(source).expanduser() / "config.json"
    if config_path.is_file():
        try:
            return head_shape_from_config(json.loads(config_path.read_text()), target), f"{source}/config.json"
        except (ValueError, KeyError, TypeError):
            pass  # a broken head config is the head loader's to report, with its file name; estimate here
    kind = head_kind_from_name(source)
    return estimated_head_shape(kind, target, draft_vocab=None), f"{kind} head estimated from the target's shape"


ESTIMATED_BLOCK_LAYERS = 5  # z-lab's published block drafters have 1 to 10 layers; 5 when no config says


def block_drafter_size(method_keys: dict, target: ModelShape) -> tuple[int, int, str]:
    """(parameters, KV entries per context token, where the figures came from) of a method's block drafter
    (graft/draft_models/dflash/model.py: target-width Qwen3-style layers and fc over the target's features; embeddings
    and LM head are the target's)."""
    source = method_keys["checkpoint"]
    raw = {}
    config_path = Path(str(source)).expanduser() / "config.json"
    if source != "random" and config_path.is_file():
        try:
            raw = json.loads(config_path.read_text())
        except (ValueError, UnicodeDecodeError):
            raw = {}
    h = target.hidden_size
    layers = raw.get("num_hidden_layers") or (
        method_keys.get("random_layers") or 1 if source == "random" else ESTIMATED_BLOCK_LAYERS
    )
    heads = raw.get("num_attention_heads") or target.num_heads
    kv_heads = raw.get("num_key_value_heads") or target.num_kv_heads
    d = raw.get("head_dim") or target.head_dim
    inter = raw.get("intermediate_size") or target.intermediate_size or 4 * h
    if source == "random":  # graft/draft_models/dflash/checkpoint.random_block_drafter's taps
        from graft.draft_models.dflash.model import spread_layer_ids

        features = len(set(spread_layer_ids(target.num_layers, min(3, max(1, target.num_layers - 2)))))
    else:  # the published drafters read as many target layers as they have layers (z-lab's rule)
        published_ids = (raw.get("dflash_config") or {}).get("target_layer_ids") or raw.get("target_layer_ids")
        features = len(published_ids or [0] * layers)
    layer = h * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * inter + 2 * h + 2 * d
    params = layers * layer + features * h * h + 2 * h
    note = f"{source}/config.json" if raw else f"block drafter estimated as {layers} target-shaped layers"
    return params, layers * 2 * kv_heads * d, note


# --- the plan -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes a run needs, by what needs them and where it lives. `shape` None: unknown, nothing checked."""

    model: str
    shape: ModelShape | None
    shape_source: str
    dtype: str = "float32"
    params: int = 0
    weights: int = 0  # every parameter in `dtype`
    layer_weights: int = 0  # one decoder layer (the GPUs split the layers between them)
    embedding_weights: int = 0  # the token embeddings (the first GPU)
    output_weights: int = 0  # the final norm and LM head (the last GPU; the norm alone when tied)
    weight_layouts: int = 0  # the CPU fast path's extra copies of the dense weights
    weight_layouts_note: str = ""
    kv_cache: int = 0  # every layer's; each GPU holds its own layers' share
    kv_tokens: int = 0
    kv_tokens_note: str = ""
    tree_logits: int = 0  # one verification's [tree nodes, vocab] in float32, on the LM head's GPU
    tree_nodes: int = 1
    prefill_logits: int = 0  # the prefill's [rows, vocab] in float32, on the LM head's GPU
    prefill_logit_rows: int = 1
    activations: int = 0  # one layer's working set over a prefill chunk, on every GPU
    prefill_rows: int = 0  # prompt positions per prefill forward
    masks: int = 0  # the attention mask a forward carries (attention_mask_bytes), on every GPU
    mask_rows: int = 0
    draft_head: int = 0  # every draft model the compared methods load, with its cache, on the LM head's GPU
    draft_head_note: str = ""
    draft_heads: int = 0
    draft_kv: int = 0  # the draft models' caches, every slot's (part of draft_head)
    batch_size: int = 1  # run.batch_size: slots decoded together, each with its own KV cache
    mask_slots: int = 1  # slots the largest mask covers (a batched verify's: B; a prefill chunk's: 1)
    num_gpus: int | None = None  # model.num_gpus when it is a number; None: as many as the plan needs
    device_map: str | None = None
    placement: str = "one"  # on CUDA: "one", "sharded" or "tensor_parallel" (gpu_placement)
    hardware_hint: str = ""

    @property
    def known(self) -> bool:
        return self.shape is not None

    @property
    def kv_layer(self) -> int:
        return self.kv_cache // self.shape.num_layers

    @property
    def working(self) -> int:
        """What the forwards need beside the weights and caches."""
        return self.tree_logits + self.prefill_logits + self.activations + self.masks

    @property
    def total(self) -> int:
        return self.weights + self.weight_layouts + self.kv_cache + self.working + self.draft_head

    def breakdown(self) -> str:
        if not self.known:
            return f"model={self.model}: unknown shape, not checked ({self.shape_source})"
        parts = [f"weights {gb(self.weights)} ({self.params / 1e9:.2f}e9 parameters in {self.dtype})"]
        if self.weight_layouts:
            parts.append(f"fast-path weight layouts {gb(self.weight_layouts)} ({self.weight_layouts_note})")
        if self.batch_size == 1:
            parts.append(f"KV cache {gb(self.kv_cache)} for {self.kv_tokens:,} tokens ({self.kv_tokens_note})")
        else:
            parts.append(
                f"KV cache {gb(self.kv_cache)} for {self.batch_size} x {self.kv_tokens:,} tokens "
                f"(run.batch_size={self.batch_size} slots of {self.kv_tokens_note})"
            )
        if self.draft_head:
            slots = f"; caches for {self.batch_size} slots" if self.batch_size > 1 and self.draft_kv else ""
            parts.append(f"{self.draft_label()} {gb(self.draft_head)} ({self.draft_head_note}{slots})")
        parts += [
            f"verification logits {gb(self.tree_logits)} ({times(self.batch_size)}{self.tree_nodes} tree nodes)",
            f"prefill logits {gb(self.prefill_logits)} ({rows(self.prefill_logit_rows)})",
            f"prefill activations {gb(self.activations)} ({self.prefill_rows:,}-token chunk)",
            f"attention masks {gb(self.masks)} ({times(self.mask_slots)}{self.mask_rows:,} x {self.kv_tokens:,})",
        ]
        return ", ".join(parts)

    def draft_label(self) -> str:
        return "draft model" if self.draft_heads == 1 else f"{self.draft_heads} draft models (one per method)"


def times(count: int) -> str:
    """The "B x " a batched figure starts with; nothing at batch 1."""
    return f"{count} x " if count > 1 else ""


def rows(count: int) -> str:
    return f"{count:,} row" if count == 1 else f"{count:,} rows"


def gb(num_bytes: float) -> str:
    return f"{num_bytes / GB:,.1f} GB" if num_bytes >= 0.1 * GB else f"{num_bytes / 1e6:,.1f} MB"


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
    )  # not at the top: graft.data.loading imports graft.config.experiment, which imports this

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
    """The target's shape without loading it, and where it came from (or why it is unknown)."""
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


def placement_map(cfg: ExperimentConfig) -> str | None:
    """The device_map the model loads with (graft/load/models.placement: the hardware's overrides the model's)."""
    return cfg.hardware.device_map or cfg.model.device_map


def gpu_placement(cfg: ExperimentConfig) -> str:
    """How the model spreads over GPUs (machine_capacity's `placement`), as graft/load/models.placement places it."""
    if cfg.hardware.tensor_parallel:
        return "tensor_parallel"
    return "sharded" if placement_map(cfg) else "one"


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


def draft_models(
    methods: list[dict], shape: ModelShape, dtype_bytes: int, tokens: int, slots: int = 1
) -> tuple[int, int, str, int]:
    """(bytes, count, where the figures came from, bytes of their caches) of the draft heads and block drafters
    the methods load, each with a cache for `tokens` positions in each of `slots` (run.batch_size: every
    slot's drafter keeps its own cache; the weights are loaded once)."""
    total, kv, note = 0, 0, ""
    head_methods = [m for m in methods if m.get("head")]  # each loads its own head (graft/methods/eagle3.py)
    if head_methods:
        head_shape, note = draft_head_shape(head_methods[0], shape)
        head_kv = 2 * head_shape.num_kv_heads * head_shape.head_dim * dtype_bytes * tokens * slots  # one layer
        total = len(head_methods) * (head_params(head_shape) * dtype_bytes + head_kv)
        kv = len(head_methods) * head_kv
    block_methods = [m for m in methods if m.get("checkpoint")]  # each loads its own block drafter
    for method in block_methods:
        block_params, block_kv_per_token, block_note = block_drafter_size(method, shape)
        total += (block_params + block_kv_per_token * tokens * slots) * dtype_bytes
        kv += block_kv_per_token * tokens * slots * dtype_bytes
        note = f"{note}; {block_note}" if note else block_note
    return total, len(head_methods) + len(block_methods), note, kv


def plan_memory(cfg: ExperimentConfig, device_type: str, batch_size: int | None = None) -> MemoryPlan:
    """What `cfg` needs on a `device_type` ("cpu" | "cuda") device, from declared sizes only; at `batch_size`
    slots when given, else run.batch_size's."""
    model = cfg.model
    batch = batch_size or cfg.run.batch_size
    common = dict(
        model=model.name,
        num_gpus=model.num_gpus if isinstance(model.num_gpus, int) else None,
        device_map=placement_map(cfg),
        # a batch decodes on one device (graft/run/runner.batched_hardware; SlotCaches on the target's device)
        placement=gpu_placement(cfg) if device_type == "cuda" and batch == 1 else "one",
        hardware_hint=model.hardware_hint,
        batch_size=batch,
    )
    shape, shape_source = model_shape(model)
    if shape is None:
        return MemoryPlan(shape=None, shape_source=shape_source, **common)
    loaded = load_dtype(model.dtype, device_type)
    dtype, copies, layouts_note = fast_path_layout(cfg.hardware.fast_path, loaded, device_type, cfg.hardware)
    dtype_bytes = DTYPE_BYTES[dtype]
    cache_bytes = DTYPE_BYTES[kv_cache_dtype(cfg.hardware, run_dtype=dtype, loaded=loaded)]
    methods = [m.flat() for m in cfg.compared]
    tree_nodes = max((m.get("total_tokens", 1) for m in methods), default=1)  # the baseline verifies 1
    tokens, tokens_note = planned_tokens(cfg, shape, tree_nodes)
    prompt = tokens - cfg.run.max_new_tokens - tree_nodes - CACHE_SLACK
    chunk = max(1, min(prompt, cfg.hardware.prefill_chunk or prompt))  # prompt positions per prefill forward
    logit_rows, _ = prefill_logit_rows(methods, chunk)
    compact = compact_masks(cfg.hardware)
    # the first chunk runs causal, without a mask; with compact masks every chunk does
    prefill_mask_rows = chunk if prompt > chunk and not compact else 0
    mask_rows, mask_slots = max(tree_nodes, prefill_mask_rows), 1
    masks = attention_mask_bytes(mask_rows, tokens, dtype_bytes, compact)
    if batch > 1:  # the batched verify's additive mask [B, 1, nodes, capacity] in the model's dtype (verify_rows)
        verify_masks = batch * tree_nodes * tokens * dtype_bytes
        prefill_masks = attention_mask_bytes(prefill_mask_rows, tokens, dtype_bytes, compact)
        masks = max(verify_masks, prefill_masks)
        mask_rows, mask_slots = (tree_nodes, batch) if verify_masks >= prefill_masks else (prefill_mask_rows, 1)
    draft, draft_count, draft_note, draft_kv = draft_models(methods, shape, dtype_bytes, tokens, batch)
    params = shape.total_params
    return MemoryPlan(
        shape=shape,
        shape_source=shape_source,
        dtype=dtype,
        params=params,
        weights=params * dtype_bytes,
        layer_weights=layer_params(shape) * dtype_bytes,
        embedding_weights=shape.vocab_size * shape.hidden_size * dtype_bytes,
        output_weights=output_params(shape) * dtype_bytes,
        weight_layouts=copies * dense_linear_params(shape) * dtype_bytes,
        weight_layouts_note=layouts_note,
        kv_cache=kv_bytes_per_token(shape, cache_bytes) * tokens * batch,
        kv_tokens=tokens,
        kv_tokens_note=tokens_note,
        tree_logits=batch * tree_nodes * shape.vocab_size * 4,
        tree_nodes=tree_nodes,
        prefill_logits=logit_rows * shape.vocab_size * 4,
        prefill_logit_rows=logit_rows,
        activations=prefill_activation_bytes(shape, chunk, dtype_bytes),
        prefill_rows=chunk,
        masks=masks,
        mask_rows=mask_rows,
        mask_slots=mask_slots,
        draft_head=draft,
        draft_kv=draft_kv,
        draft_head_note=draft_note,
        draft_heads=draft_count,
        **common,
    )


# --- where each part lives ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuShare:
    """What one GPU holds: bytes by part."""

    index: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def breakdown(self) -> str:
        return ", ".join(f"{name} {gb(size)}" for name, size in self.parts.items() if size)


def layer_split(num_layers: int, gpus: int) -> list[int]:
    """Layers per GPU as Accelerate's balanced device_map spreads them, roughly: num_layers / gpus each,
    the first GPUs taking one more where it does not divide (the last one holds the LM head)."""
    base, extra = divmod(num_layers, gpus)
    return [base + (index < extra) for index in range(gpus)]


def place(plan: MemoryPlan, gpus: int) -> list[GpuShare]:
    """What each of `gpus` GPUs holds: its layers and their KV cache, a prefill chunk's activations and the
    attention mask on every one, the embeddings on the first, and on the last the LM head with what works
    on its logits (graft/backends: drafting lives on the LM head's device)."""
    if plan.placement == "tensor_parallel":
        return tensor_parallel_shares(plan, gpus)
    num_layers = plan.shape.num_layers
    last = 0 if plan.shape.tie_embeddings else gpus - 1  # a tied LM head stays with the embeddings
    shares = []
    for index, layers in enumerate(layer_split(num_layers, gpus)):
        parts = {
            f"{layers} layers": layers * plan.layer_weights,
            "fast-path layouts": plan.weight_layouts * layers // num_layers,  # they follow their layers
            "KV cache": layers * plan.kv_layer,
            "prefill activations": plan.activations,
            "attention mask": plan.masks,
        }
        if index == 0:
            parts["embeddings"] = plan.embedding_weights
        if index == last:
            parts["LM head"] = plan.output_weights
            parts[plan.draft_label()] = plan.draft_head
            if gpus > 1 and last != 0 and plan.draft_head:  # drafting embeds here (TargetBackend.embed's table)
                parts["drafting embeddings"] = plan.embedding_weights
            parts["verification logits"] = plan.tree_logits
            parts["prefill logits"] = plan.prefill_logits
        shares.append(GpuShare(index, parts))
    return shares


def tensor_parallel_shares(plan: MemoryPlan, gpus: int) -> list[GpuShare]:
    """tp_plan="auto": every GPU holds 1/gpus of each layer's weights and KV heads, and its own copy of the
    rest (each process runs the whole decode loop on gathered logits)."""
    parts = {
        "weight shard": (plan.weights + plan.weight_layouts) // gpus,
        "KV cache shard": plan.kv_cache // gpus,
        plan.draft_label(): plan.draft_head,
        "working set": plan.working,
    }
    return [GpuShare(index, dict(parts)) for index in range(gpus)]


def gpus_needed(plan: MemoryPlan, free_per_gpu: list[int], headroom: float = CUDA_HEADROOM) -> int | None:
    """The smallest count k for which every one of the first k GPUs holds its share (free memory less
    `headroom`); None when none does. More GPUs than layers would hold nothing more."""
    for k in range(1, min(len(free_per_gpu), plan.shape.num_layers) + 1):
        if all(share.total <= free * (1 - headroom) for share, free in zip(place(plan, k), free_per_gpu)):
            return k
    return None


def gpus_needed_like(plan: MemoryPlan, gpu_bytes: int) -> int | None:
    """gpus_needed on identical GPUs of `gpu_bytes` free each."""
    return gpus_needed(plan, [gpu_bytes] * plan.shape.num_layers)


def planned_gpus(cfg: ExperimentConfig, free_per_gpu: list[int]) -> tuple[int, str]:
    """How many of these GPUs a sharded run uses, and why: model.num_gpus when it is a number, else the
    smallest count whose per-GPU plan fits (every one of them when none does or the shape is unknown: the
    memory check then says why)."""
    if isinstance(cfg.model.num_gpus, int):
        return cfg.model.num_gpus, f"model.num_gpus={cfg.model.num_gpus}"
    if cfg.run.batch_size > 1:  # the memory check then says whether it fits, and which batch size would
        return 1, f"run.batch_size={cfg.run.batch_size}: a batched run decodes on one GPU"
    plan = plan_memory(cfg, "cuda")
    if not plan.known:
        return len(free_per_gpu), "unknown model shape, every visible GPU"
    needed = gpus_needed(plan, free_per_gpu)
    if needed is None:
        return len(free_per_gpu), f"the memory plan fits on none of the {len(free_per_gpu)} visible GPUs"
    return needed, f"plan needs {needed}"


def reference_gpus(cfg: ExperimentConfig, gpu_bytes: int | None = None) -> int:
    """GPUs a job asks a scheduler for before it runs (the SLURM launcher, `${gpus_needed:}`):
    model.num_gpus when it is a number, else the plan's count on GPUs of `gpu_bytes` (an H200 when not
    given); 1 for an unknown shape. A batched run (run.batch_size > 1) decodes on one GPU: one, or refused
    naming the largest batch size that fits one, rather than GPUs the run could not use."""
    if isinstance(cfg.model.num_gpus, int):
        return cfg.model.num_gpus
    plan = plan_memory(cfg, "cuda")
    if not plan.known:
        return 1
    size = gpu_bytes or REFERENCE_GPUS[0][1]
    needed = gpus_needed_like(plan, size)
    if plan.batch_size > 1 and needed != 1:
        usable = int(size * (1 - CUDA_HEADROOM))
        raise ConfigError(
            f"run.batch_size={plan.batch_size} does not fit one GPU with {gb(size)} ({gb(usable)} after keeping "
            f"{CUDA_HEADROOM:.0%} as headroom), and a batched run decodes on one GPU (it does not shard the model): "
            f"{batch_fit(largest_batch(cfg, 'cuda', usable), 'one')}. {needs_text(plan)}"
        )
    if needed is None:
        raise ConfigError(f"model={plan.model} fits no count of GPUs with {gb(size)}: {needs_text(plan)}")
    return needed


def gpu_type_bytes(gpu_type: str) -> int:
    """The memory of a GPU type a scheduler is asked for (GRAFT_SLURM_GPU), refused in one line when unknown."""
    if gpu_type.lower() not in GPU_TYPES:
        raise ConfigError(f"GPU type {gpu_type!r}; allowed: {', '.join(GPU_TYPES)}")
    return int(GPU_TYPES[gpu_type.lower()])


def host_memory_gb(plan: MemoryPlan) -> int:
    """Host RAM a GPU job asks its scheduler for (the SLURM launcher's mem_gb): the target's weights and the draft
    models once (loading reads every checkpoint shard through host memory, and a cluster that counts the page
    cache of memory-mapped files counts them) plus the process itself, rounded up to steps of 32 GB."""
    if not plan.known:
        return UNKNOWN_HOST_MEMORY_GB
    # the draft caches live on the GPU: host memory keeps batch 1's figure (one slot's) at any run.batch_size
    other_slots = plan.draft_kv - plan.draft_kv // plan.batch_size
    need = (plan.weights + plan.draft_head - other_slots) / GB + HOST_PROCESS_GB
    return math.ceil(need / HOST_MEMORY_STEP_GB) * HOST_MEMORY_STEP_GB


# --- what the machine offers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """Bytes a run may plan for on this machine, and where the figure came from."""

    usable: int  # after headroom
    offered: int  # as the machine reports it
    source: str
    device: str  # "cpu" | "cuda"
    gpus_visible: int = 0
    free_per_gpu: tuple[int, ...] = ()  # free bytes of each GPU the model will use, in order
    headroom: float = 0.0

    @property
    def per_gpu(self) -> int | None:
        """Free bytes of the first GPU used (sizes the GPUs a refusal asks for)."""
        return self.free_per_gpu[0] if self.free_per_gpu else None

    def usable_on(self, index: int) -> int:
        return int(self.free_per_gpu[index] * (1 - self.headroom))


def cpu_capacity(available: int, source: str = "CPU RAM available") -> Capacity:
    return Capacity(usable=available, offered=available, source=source, device="cpu")


def cuda_capacity(free_per_gpu: list[int], gpus_visible: int, headroom: float = CUDA_HEADROOM) -> Capacity:
    """The GPUs the model will use, each with its free memory."""
    offered = sum(free_per_gpu)
    source = f"free CUDA memory on {len(free_per_gpu)} of {gpus_visible} visible GPU(s)"
    return Capacity(
        usable=int(offered * (1 - headroom)),
        offered=offered,
        source=source,
        device="cuda",
        gpus_visible=gpus_visible,
        free_per_gpu=tuple(free_per_gpu),
        headroom=headroom,
    )


def available_ram() -> tuple[int | None, str]:
    """Bytes of RAM the kernel could give this process now (MemAvailable), or psutil's figure."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "CPU RAM available, /proc/meminfo"  # kB
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None, "no /proc/meminfo and no psutil"
    return int(psutil.virtual_memory().available), "CPU RAM available, psutil"


def cuda_free_memory() -> list[int]:
    """Free bytes on every visible GPU (opens a CUDA context on each)."""
    import torch

    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


def machine_capacity(device_type: str, placement: str = "one", num_gpus: int | None = None) -> Capacity | None:
    """What this machine offers the model on `device_type`; None when it cannot tell. On CUDA `placement`
    is "one" (one device), "sharded" (a device_map over the first `num_gpus` GPUs, every visible one when
    None) or "tensor_parallel" (one process per GPU under torchrun: this process's GPU, WORLD_SIZE times).
    Only the GPUs this process will use are asked for their free memory, which opens a CUDA context on each."""
    if device_type == "cpu":
        available, source = available_ram()
        return None if available is None else cpu_capacity(available, source)
    import torch

    visible = torch.cuda.device_count()
    if placement == "sharded":
        used = min(num_gpus or visible, visible)  # more than are visible is refused by count (check)
        return cuda_capacity([torch.cuda.mem_get_info(i)[0] for i in range(used)], visible)
    if placement == "tensor_parallel":
        local = int(os.environ.get("LOCAL_RANK", 0))
        return cuda_capacity([torch.cuda.mem_get_info(local)[0]] * int(os.environ.get("WORLD_SIZE", 1)), visible)
    return cuda_capacity([torch.cuda.mem_get_info(torch.cuda.current_device())[0]], visible)


# --- the verdict ----------------------------------------------------------------------------------------


def largest_batch(cfg: ExperimentConfig, device_type: str, usable: int) -> int:
    """The largest run.batch_size below cfg's whose plan fits `usable` bytes on one device (a batched run's
    placement); 0 when not even one sequence does."""
    low, high = 0, cfg.run.batch_size - 1  # the plan grows with the batch: bisect
    while low < high:
        middle = (low + high + 1) // 2
        if plan_memory(cfg, device_type, batch_size=middle).total <= usable:
            low = middle
        else:
            high = middle - 1
    return low


def batch_fit(fits: int | None, where: str) -> str:
    """The batch size that fits `where` (largest_batch's `fits`; None: not computed)."""
    if fits is None:
        return "a smaller run.batch_size needs less"
    if fits == 0:
        return f"not even one sequence fits {where} (run.batch_size=1 may shard the model over several GPUs)"
    return f"run.batch_size={fits} is the most that fits {where}"


def what_it_needs(
    plan: MemoryPlan, capacity: Capacity, on_gpus: MemoryPlan | None = None, batch_fits: int | None = None
) -> str:
    """The GPUs that would hold the run (`on_gpus`: its plan on CUDA; else this plan), each holding its
    share, in GPUs like this machine's or the common sizes; for a batched run, which batch size fits here
    (`batch_fits`, largest_batch's)."""
    if plan.batch_size > 1:
        said = f"run.batch_size={plan.batch_size} decodes on one device (a batched run does not shard the model)"
        return f"{said}: {batch_fit(batch_fits, 'here')}."
    sized = on_gpus if on_gpus is not None else plan
    if capacity.device == "cuda" and capacity.per_gpu:
        gpus = [(f"GPUs with {gb(capacity.per_gpu)} free like this machine's", capacity.per_gpu)]
    else:
        gpus = [(f"{name} ({gb(size)})", size) for name, size in REFERENCE_GPUS]
    counts = [gpus_needed_like(sized, size) for _, size in gpus]
    options = " or ".join(
        f"{count} {label}" if count else f"more than {sized.shape.num_layers} {label}"
        for count, (label, _) in zip(counts, gpus)
    )
    hint = f"; model.hardware_hint: {plan.hardware_hint}" if plan.hardware_hint else ""
    return (
        f"It needs about {options}, each GPU holding its share with {CUDA_HEADROOM:.0%} kept as headroom "
        f"(hardware=auto takes that many on such a node; model.num_gpus={plan.num_gpus or 'auto'}){hint}."
    )


def offered_text(capacity: Capacity) -> str:
    if capacity.headroom:
        return (
            f"{gb(capacity.offered)} ({capacity.source}), {gb(capacity.usable)} after keeping "
            f"{capacity.headroom:.0%} as headroom"
        )
    return f"{gb(capacity.offered)} ({capacity.source})"


ESCAPE = "run.skip_memory_check=true skips this check."


def check(
    plan: MemoryPlan, capacity: Capacity, on_gpus: MemoryPlan | None = None, batch_fits: int | None = None
) -> None:
    """Refuse (ConfigError) a plan that needs more GPUs than are visible, more than a GPU offers on any
    one of them, or more bytes than the CPU offers; `on_gpus`, the same run planned for CUDA, sizes the
    GPUs a refusal on the CPU asks for; `batch_fits`, the run.batch_size that would fit (largest_batch)."""
    if not plan.known:
        return
    if capacity.device == "cuda":
        check_gpus(plan, capacity, batch_fits)
        return
    if plan.total > capacity.usable:
        raise ConfigError(
            f"{needs_text(plan)}; this machine offers {offered_text(capacity)}. "
            f"{what_it_needs(plan, capacity, on_gpus, batch_fits)} {ESCAPE}"
        )


def needs_text(plan: MemoryPlan) -> str:
    at = f" at run.batch_size={plan.batch_size}" if plan.batch_size > 1 else ""
    return f"model={plan.model}{at} needs about {gb(plan.total)} (GB = 1e9 bytes: {plan.breakdown()})"


def check_gpus(plan: MemoryPlan, capacity: Capacity, batch_fits: int | None = None) -> None:
    """Each GPU's share (place) against that GPU's free memory less headroom; the refusal names the GPU
    that overflows most, by how much, and what it holds."""
    if plan.num_gpus and plan.num_gpus > capacity.gpus_visible:
        raise ConfigError(
            f"model={plan.model} asks for {plan.num_gpus} GPUs (model.num_gpus={plan.num_gpus}) and this machine "
            f"shows {capacity.gpus_visible} (torch.cuda.device_count()); {needs_text(plan)}. {ESCAPE}"
        )
    shares = place(plan, len(capacity.free_per_gpu))
    over = {s.index: s.total - capacity.usable_on(s.index) for s in shares if s.total > capacity.usable_on(s.index)}
    if not over:
        return
    worst = shares[max(over, key=over.get)]
    others = [f"GPU {i} by {gb(excess)}" for i, excess in over.items() if i != worst.index]
    also = f"; also over: {', '.join(others)}" if others else ""
    raise ConfigError(
        f"model={plan.model} overflows GPU {worst.index} (of {len(shares)} used) by {gb(over[worst.index])}: it "
        f"needs {gb(worst.total)} there ({worst.breakdown()}) and GPU {worst.index} offers "
        f"{gb(capacity.usable_on(worst.index))} ({gb(capacity.free_per_gpu[worst.index])} free less "
        f"{capacity.headroom:.0%} headroom){also}. {needs_text(plan)}. "
        f"{what_it_needs(plan, capacity, batch_fits=batch_fits)} {ESCAPE}"
    )
