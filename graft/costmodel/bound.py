"""The bandwidth bound of a decode or verify step on a GPU: the weight bytes it must read over the memory's
bandwidth. Arithmetic on published numbers, not a measurement; pure (no torch), so docs and tests use it.

A decode step of a dense model reads every weight once; a verification of n nodes reads the same bytes (the
extra work per node is compute, which on an H200 stays under the read time up to about 100 nodes at 8B). An
MoE layer reads the experts its tokens were routed to: `moe_step_bytes` counts them from experts touched.
"""

from __future__ import annotations

# Peak HBM bandwidth, GB/s (1e9 bytes), by the name torch.cuda.get_device_name reports. Source: NVIDIA's product
# datasheets (H200: 4.8 TB/s; H100 SXM5: 3.35 TB/s; H100 PCIe: 2.0 TB/s; H100 NVL: 3.9 TB/s; A100 SXM4 80GB:
# 2.039 TB/s; A100 SXM4 40GB: 1.555 TB/s; A100 80GB PCIe: 1.935 TB/s). A spec-sheet peak: a device-to-device
# copy on this workplace's H200 moved about 4.3 TB/s (/work/.library/device/KINDS.md, 2026-10-28), 90% of it.
HBM_BANDWIDTH_GBS = {
    "NVIDIA H200": 4800.0,
    "NVIDIA H100 80GB HBM3": 3350.0,
    "NVIDIA H100 PCIe": 2000.0,
    "NVIDIA H100 NVL": 3900.0,
    "NVIDIA A100-SXM4-80GB": 2039.0,
    "NVIDIA A100-SXM4-40GB": 1555.0,
    "NVIDIA A100 80GB PCIe": 1935.0,
}


def bandwidth_gbs(gpu_name: str | None) -> float | None:
    """The table's bandwidth for a GPU name (exact, else the longest table name it contains); None if unknown."""
    if not gpu_name:
        return None
    if gpu_name in HBM_BANDWIDTH_GBS:
        return HBM_BANDWIDTH_GBS[gpu_name]
    known = [name for name in HBM_BANDWIDTH_GBS if name in gpu_name]
    return HBM_BANDWIDTH_GBS[max(known, key=len)] if known else None


def bound_ms(num_bytes: float, gbs: float) -> float:
    """Milliseconds to read `num_bytes` once at `gbs` GB/s."""
    return num_bytes / (gbs * 1e9) * 1e3


def attention_params(shape: dict) -> int:
    """One layer's attention weights (q, k, v, o), from a transformers config's fields."""
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape.get("head_dim") or hidden // heads
    return hidden * head_dim * (2 * heads + 2 * kv_heads)


def embedding_params(shape: dict) -> int:
    """The embedding table and the LM head (one matrix when tied)."""
    return shape["vocab_size"] * shape["hidden_size"] * (1 if shape.get("tie_word_embeddings") else 2)


def expert_params(shape: dict) -> int:
    """One expert's gate, up and down projections."""
    return 3 * shape["hidden_size"] * shape["moe_intermediate_size"]


def dense_step_bytes(shape: dict, dtype_bytes: int = 2) -> int:
    """Bytes a dense model's decode step reads: every weight once (norms left out: under 0.01%)."""
    mlp = 3 * shape["hidden_size"] * shape["intermediate_size"]
    layers = shape["num_hidden_layers"] * (attention_params(shape) + mlp)
    return dtype_bytes * (layers + embedding_params(shape))


def moe_step_bytes(shape: dict, experts_touched: float, dtype_bytes: int = 2, layers: int | None = None) -> float:
    """Bytes an MoE model's step reads when each of its layers reads `experts_touched` experts (a decode step:
    top_k): attention, router and the experts touched per layer, and the embeddings and LM head once."""
    count = shape["num_hidden_layers"] if layers is None else layers
    router = shape["num_experts"] * shape["hidden_size"]
    per_layer = attention_params(shape) + router + experts_touched * expert_params(shape)
    return dtype_bytes * (count * per_layer + embedding_params(shape))


def random_routing_experts(nodes: int, experts: int, top_k: int) -> float:
    """Expected distinct experts per layer that `nodes` tokens touch if each picked its top_k independently and
    uniformly: experts * (1 - (1 - top_k / experts) ** nodes). Real routing is correlated and touches fewer."""
    return experts * (1 - (1 - top_k / experts) ** nodes)
