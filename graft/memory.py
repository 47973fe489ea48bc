"""Memory planning before a model loads: the bytes a run needs, from the sizes its config declares, against
what this machine offers, so that a run that cannot fit is refused in seconds (with the figures) instead
of after a download of hundreds of GB.

What is counted: the target's weights (parameters x bytes of the dtype, plus the extra weight layouts a
CPU fast path keeps), the KV cache of the longest prompt the run plans for + the new tokens + the draft
tree, the verification's logits [tree nodes, vocab] in float32 plus an allowance for one layer's prefill
activations, and the draft head (one decoder layer at the head's shape, its fc and lm_head, its KV cache).
What is offered: on CUDA the free memory of the GPUs the model will use, 10% kept as headroom (CUDA
context, allocator fragmentation, the library's workspaces); on the CPU the RAM the kernel reports as
available. GB = 1e9 bytes throughout.

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
from graft.shapes import (  # noqa: F401 (the plan's shapes, read from here by callers and tests)
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
    from graft.config import ExperimentConfig, ModelConfig

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
        return self.hidden_size // self.num_heads  # as graft/eagle/head.py builds it


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
    """A published head is one layer at the target's width (graft/eagle/checkpoint.py builds random heads
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
    """A head's own config.json, read as graft/eagle/checkpoint.head_config reads it."""
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
    if source == "random":  # graft/eagle/checkpoint.random_head: the target's shape and vocabulary
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
    (graft/dflash/model.py: target-width Qwen3-style layers and fc over the target's features; embeddings
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
    if source == "random":  # graft/dflash/checkpoint.random_block_drafter's taps
        from graft.dflash.model import spread_layer_ids

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
    """Bytes a run needs on its device, by what needs them. `shape` None: unknown, nothing checked."""

    model: str
    shape: ModelShape | None
    shape_source: str
    dtype: str = "float32"
    params: int = 0
    weights: int = 0
    weight_layouts: int = 0  # the CPU fast path's extra copies of the dense weights
    weight_layouts_note: str = ""
    kv_cache: int = 0
    kv_tokens: int = 0
    kv_tokens_note: str = ""
    tree: int = 0  # verification logits and prefill activations
    tree_nodes: int = 1
    draft_head: int = 0  # every head the compared methods load
    draft_head_note: str = ""
    draft_heads: int = 0
    num_gpus: int = 1
    device_map: str | None = None
    hardware_hint: str = ""

    @property
    def known(self) -> bool:
        return self.shape is not None

    @property
    def total(self) -> int:
        return self.weights + self.weight_layouts + self.kv_cache + self.tree + self.draft_head

    def breakdown(self) -> str:
        if not self.known:
            return f"model={self.model}: unknown shape, not checked ({self.shape_source})"
        parts = [f"weights {gb(self.weights)} ({self.params / 1e9:.2f}e9 parameters in {self.dtype})"]
        if self.weight_layouts:
            parts.append(f"fast-path weight layouts {gb(self.weight_layouts)} ({self.weight_layouts_note})")
        parts.append(f"KV cache {gb(self.kv_cache)} for {self.kv_tokens:,} tokens ({self.kv_tokens_note})")
        if self.draft_head:
            label = "draft model" if self.draft_heads == 1 else f"{self.draft_heads} draft models (one per method)"
            parts.append(f"{label} {gb(self.draft_head)} ({self.draft_head_note})")
        parts.append(f"tree and activations {gb(self.tree)} ({self.tree_nodes} tree nodes)")
        return ", ".join(parts)


def gb(num_bytes: float) -> str:
    return f"{num_bytes / GB:,.1f} GB" if num_bytes >= 0.1 * GB else f"{num_bytes / 1e6:,.1f} MB"


def load_dtype(model_dtype: str, device_type: str) -> str:
    """graft/models._dtype: `auto` is float32 on the CPU and bfloat16 on a GPU."""
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
    from graft.data.builtin import BUILTIN  # not at the top: graft.data imports graft.config, which imports this

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
    """The device_map the model loads with (graft/models.placement: the hardware's overrides the model's)."""
    return cfg.hardware.device_map or cfg.model.device_map


def gpu_placement(cfg: ExperimentConfig) -> str:
    """How the model spreads over GPUs (machine_capacity's `placement`), as graft/models.placement places it."""
    if cfg.hardware.tensor_parallel:
        return "tensor_parallel"
    return "sharded" if placement_map(cfg) else "one"


def plan_memory(cfg: ExperimentConfig, device_type: str) -> MemoryPlan:
    """What `cfg` needs on a `device_type` ("cpu" | "cuda") device, from declared sizes only."""
    model = cfg.model
    common = dict(
        model=model.name, num_gpus=model.num_gpus, device_map=placement_map(cfg), hardware_hint=model.hardware_hint
    )
    shape, shape_source = model_shape(model)
    if shape is None:
        return MemoryPlan(shape=None, shape_source=shape_source, **common)
    dtype, copies, layouts_note = fast_path_layout(
        cfg.hardware.fast_path, load_dtype(model.dtype, device_type), device_type, cfg.hardware
    )
    dtype_bytes = DTYPE_BYTES[dtype]
    methods = [m.flat() for m in cfg.compared]
    tree_nodes = max((m.get("total_tokens", 1) for m in methods), default=1)  # the baseline verifies 1
    tokens, tokens_note = planned_tokens(cfg, shape, tree_nodes)
    prompt_tokens = tokens - tree_nodes - CACHE_SLACK
    logits = tree_nodes * shape.vocab_size * 4  # [tree nodes, vocab] float32
    head, head_note = 0, ""
    head_methods = [m for m in methods if m.get("head")]  # each loads its own head (graft/methods/eagle3.py)
    if head_methods:
        head_shape, head_note = draft_head_shape(head_methods[0], shape)
        head_kv = 2 * head_shape.num_kv_heads * head_shape.head_dim * dtype_bytes * tokens  # one layer
        head = len(head_methods) * (head_params(head_shape) * dtype_bytes + head_kv)
    block_methods = [m for m in methods if m.get("checkpoint")]  # each loads its own block drafter
    for method in block_methods:
        block_params, block_kv_per_token, block_note = block_drafter_size(method, shape)
        head += (block_params + block_kv_per_token * tokens) * dtype_bytes
        head_note = f"{head_note}; {block_note}" if head_note else block_note
    params = shape.total_params
    return MemoryPlan(
        shape=shape,
        shape_source=shape_source,
        dtype=dtype,
        params=params,
        weights=params * dtype_bytes,
        weight_layouts=copies * dense_linear_params(shape) * dtype_bytes,
        weight_layouts_note=layouts_note,
        kv_cache=kv_bytes_per_token(shape, dtype_bytes) * tokens,
        kv_tokens=tokens,
        kv_tokens_note=tokens_note,
        tree=logits + prefill_activation_bytes(shape, prompt_tokens, dtype_bytes),
        tree_nodes=tree_nodes,
        draft_head=head,
        draft_head_note=head_note,
        draft_heads=len(head_methods) + len(block_methods),
        **common,
    )


# --- what the machine offers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """Bytes a run may plan for on this machine, and where the figure came from."""

    usable: int  # after headroom
    offered: int  # as the machine reports it
    source: str
    device: str  # "cpu" | "cuda"
    gpus_visible: int = 0
    per_gpu: int | None = None  # free bytes of the first GPU used (sizes the GPUs a refusal asks for)
    headroom: float = 0.0


def cpu_capacity(available: int, source: str = "CPU RAM available") -> Capacity:
    return Capacity(usable=available, offered=available, source=source, device="cpu")


def cuda_capacity(free_per_gpu: list[int], gpus_visible: int, headroom: float = CUDA_HEADROOM) -> Capacity:
    """The GPUs the model will use: all visible ones when sharded (device_map), else the one device."""
    offered = sum(free_per_gpu)
    source = f"free CUDA memory on {len(free_per_gpu)} of {gpus_visible} visible GPU(s)"
    return Capacity(
        usable=int(offered * (1 - headroom)),
        offered=offered,
        source=source,
        device="cuda",
        gpus_visible=gpus_visible,
        per_gpu=free_per_gpu[0] if free_per_gpu else None,
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


def machine_capacity(device_type: str, placement: str = "one") -> Capacity | None:
    """What this machine offers the model on `device_type`; None when it cannot tell. On CUDA `placement`
    is "one" (one device), "sharded" (a device_map over every visible GPU) or "tensor_parallel" (one
    process per GPU under torchrun: this process's GPU, WORLD_SIZE times). Only the GPUs this process
    will use are asked for their free memory, which opens a CUDA context on each."""
    if device_type == "cpu":
        available, source = available_ram()
        return None if available is None else cpu_capacity(available, source)
    import torch

    visible = torch.cuda.device_count()
    if placement == "sharded":
        return cuda_capacity([torch.cuda.mem_get_info(i)[0] for i in range(visible)], visible)
    if placement == "tensor_parallel":
        local = int(os.environ.get("LOCAL_RANK", 0))
        return cuda_capacity([torch.cuda.mem_get_info(local)[0]] * int(os.environ.get("WORLD_SIZE", 1)), visible)
    return cuda_capacity([torch.cuda.mem_get_info(torch.cuda.current_device())[0]], visible)


# --- the verdict ----------------------------------------------------------------------------------------


def gpus_needed(total: int, per_gpu: int, headroom: float = CUDA_HEADROOM) -> int:
    return max(1, math.ceil(total / (per_gpu * (1 - headroom))))


def what_it_needs(plan: MemoryPlan, capacity: Capacity, on_gpus: MemoryPlan | None = None) -> str:
    """The GPUs that would hold the run (`on_gpus`: its plan on CUDA; else this plan less the CPU fast
    path's weight layouts), in GPUs like this machine's or the common sizes."""
    total = on_gpus.total if on_gpus is not None else plan.total - plan.weight_layouts
    if capacity.device == "cuda" and capacity.per_gpu:
        gpus = [(f"GPUs with {gb(capacity.per_gpu)} free like this machine's", capacity.per_gpu)]
    else:
        gpus = [(f"{name} ({gb(size)})", size) for name, size in REFERENCE_GPUS]
    counts = [gpus_needed(total, size) for _, size in gpus]
    options = " or ".join(f"{count} {label}" for count, (label, _) in zip(counts, gpus))
    shard = "" if plan.device_map or max(counts) == 1 else ", model.device_map=auto"
    hint = f"; model.hardware_hint: {plan.hardware_hint}" if plan.hardware_hint else ""
    return (
        f"It needs about {options}, {CUDA_HEADROOM:.0%} kept as headroom "
        f"(hardware=gpu, model.num_gpus={plan.num_gpus}{shard}){hint}."
    )


def offered_text(capacity: Capacity) -> str:
    if capacity.headroom:
        return (
            f"{gb(capacity.offered)} ({capacity.source}), {gb(capacity.usable)} after keeping "
            f"{capacity.headroom:.0%} as headroom"
        )
    return f"{gb(capacity.offered)} ({capacity.source})"


ESCAPE = "run.skip_memory_check=true skips this check."


def check(plan: MemoryPlan, capacity: Capacity, on_gpus: MemoryPlan | None = None) -> None:
    """Refuse (ConfigError) a plan that needs more GPUs than are visible, or more bytes than are offered;
    `on_gpus`, the same run planned for CUDA, sizes the GPUs a refusal on the CPU asks for."""
    if not plan.known:
        return
    needs = f"model={plan.model} needs about {gb(plan.total)} (GB = 1e9 bytes: {plan.breakdown()})"
    if capacity.device == "cuda" and plan.num_gpus > capacity.gpus_visible:
        raise ConfigError(
            f"model={plan.model} asks for {plan.num_gpus} GPUs (model.num_gpus={plan.num_gpus}) and this machine "
            f"shows {capacity.gpus_visible} (torch.cuda.device_count()); {needs}. {ESCAPE}"
        )
    if plan.total > capacity.usable:
        raise ConfigError(
            f"{needs}; this machine offers {offered_text(capacity)}. {what_it_needs(plan, capacity, on_gpus)} {ESCAPE}"
        )


def check_memory(cfg: ExperimentConfig) -> MemoryPlan | None:
    """Plan `cfg`'s memory on the device it will run on and refuse it if this machine cannot hold it.
    Reads only configs and local files: no download, no model built."""
    if cfg.run.skip_memory_check:
        return None
    from graft.hardware import resolve_device

    device_type = resolve_device(cfg.hardware).type
    plan = plan_memory(cfg, device_type)
    if plan.known:
        capacity = machine_capacity(device_type, gpu_placement(cfg))
        if capacity is not None:
            check(plan, capacity, on_gpus=plan_memory(cfg, "cuda") if device_type == "cpu" else None)
    return plan
