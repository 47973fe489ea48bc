"""The memory plan of a run before its model loads (plan_memory): the bytes it needs, by what needs them
(MemoryPlan), from the sizes its config declares, so that a run that cannot fit is refused in seconds
(graft/plan/fit.py, with the figures) instead of after a download of hundreds of GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.config.shapes import ModelShape, dense_linear_params
from graft.cpu.layout import fast_path_layout
from graft.plan.drafters import draft_models
from graft.plan.sizes import (
    CACHE_SLACK,
    DTYPE_BYTES,
    GB,
    kv_bytes_per_token,
    kv_cache_dtype,
    layer_params,
    load_dtype,
    model_shape,
    output_params,
    planned_masks,
    planned_tokens,
    prefill_activation_bytes,
    prefill_logit_rows,
)

if TYPE_CHECKING:
    from graft.config.schema import ExperimentConfig


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


def placement_map(cfg: ExperimentConfig) -> str | None:
    """The device_map the model loads with (graft/load/models.placement: the hardware's overrides the model's)."""
    return cfg.hardware.device_map or cfg.model.device_map


def gpu_placement(cfg: ExperimentConfig) -> str:
    """How the model spreads over GPUs (machine_capacity's `placement`), as graft/load/models.placement places it."""
    if cfg.hardware.tensor_parallel:
        return "tensor_parallel"
    return "sharded" if placement_map(cfg) else "one"


def plan_memory(cfg: ExperimentConfig, device_type: str, batch_size: int | None = None) -> MemoryPlan:
    """What `cfg` needs on a `device_type` ("cpu" | "cuda") device, from declared sizes only; at `batch_size`
    slots when given, else run.batch_size's.

    What is counted: the target's weights (parameters x bytes of the dtype, plus the extra weight layouts a
    CPU fast path keeps), the KV cache of the longest prompt the run plans for + the new tokens + the draft
    tree, a verification's logits [tree nodes, vocab] and the prefill's (a chunk's rows when a method reads
    every prompt position, else one) in float32, one layer's activations over a prefill chunk, the attention
    mask a forward carries, and the draft models (graft/plan/drafters.py). At run.batch_size=B (graft/batch.py)
    the KV cache is B slots of the planned tokens, the verification's logits and mask are B trees' (the mask
    over each slot's whole capacity), each slot's drafter has its own draft cache (the draft weights once); a
    newcomer's prefill runs alone, so its logits, activations and mask stay one chunk's. A batched run decodes
    on one device (it does not shard), so at B > 1 the plan is placed on one GPU (graft/plan/placement.py)."""
    model = cfg.model
    batch = batch_size or cfg.run.batch_size
    common = dict(
        model=model.name,
        num_gpus=model.num_gpus if isinstance(model.num_gpus, int) else None,
        device_map=placement_map(cfg),
        # a batch decodes on one device (graft/run/batched.batched_hardware; SlotCaches on the target's device)
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
    masks, mask_rows, mask_slots = planned_masks(
        cfg.hardware, batch, prompt=prompt, chunk=chunk, tree_nodes=tree_nodes, tokens=tokens, dtype_bytes=dtype_bytes
    )
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
