"""The draft models' sizes before they load: an EAGLE head's shape (from its config.json, or estimated from
the target's), a block drafter's parameters and cache, and what the compared methods' draft models take together
with their caches (draft_models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from graft.config.shapes import ModelShape

EAGLE3_DRAFT_VOCAB = 32000  # the draft vocabulary of the published EAGLE-3 heads


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
