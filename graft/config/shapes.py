"""A decoder-only transformer's sizes, read from a Hugging Face config.json (or a model config's declared
`shape`) before anything loads, and the parameter counts that follow from them (graft/plan/memory.py plans with them).
"""

from __future__ import annotations

from dataclasses import dataclass

from graft.schema import ConfigError, suggest

# model.shape keys: the Hugging Face config.json fields the plan reads.
SHAPE_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "max_position_embeddings",
    "attention_bias",
)
REQUIRED_SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (0 when every layer is a mixture of experts and none is given)
    vocab_size: int
    tie_embeddings: bool = False
    num_experts: int = 0  # 0 = dense
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    max_position_embeddings: int | None = None
    qkv_bias: bool = False  # Qwen2 has biases on q/k/v
    qk_norm: bool = False  # Qwen3 normalises q and k per head
    params: int | None = None  # total parameter count when known; else computed from the shape

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelShape:
        """Read a Hugging Face config.json dict (llama, qwen2, qwen3, qwen3_moe field names); a multimodal
        config's text part. Raises ValueError naming a missing field."""
        if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
            config = config["text_config"]
        missing = [key for key in REQUIRED_SHAPE_KEYS if config.get(key) is None]
        if missing:
            raise ValueError(f"the config has no {', '.join(missing)}")
        model_type = config.get("model_type", "")
        heads = int(config["num_attention_heads"])
        num_experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        intermediate = int(config.get("intermediate_size") or 0)
        if not num_experts and not intermediate:
            raise ValueError("the config has no intermediate_size")
        return cls(
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate_size=intermediate,
            vocab_size=int(config["vocab_size"]),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=num_experts,
            experts_per_token=int(config.get("num_experts_per_tok") or 0),
            # Mixtral names its experts' width intermediate_size
            moe_intermediate_size=int(config.get("moe_intermediate_size") or intermediate) if num_experts else 0,
            max_position_embeddings=config.get("max_position_embeddings"),
            qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
        )

    @property
    def total_params(self) -> int:
        return self.params if self.params is not None else count_parameters(self)


def attention_weights(shape: ModelShape) -> int:
    """The q, k, v, o matrices of one layer (head_dim may differ from hidden / heads, as in Qwen3-235B)."""
    q_width, kv_width = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return shape.hidden_size * (q_width + 2 * kv_width) + q_width * shape.hidden_size


def attention_params(shape: ModelShape) -> int:
    """One layer's attention: its matrices, Qwen2's q/k/v biases and Qwen3's per-head q/k norms."""
    q_width, kv_width = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    bias = q_width + 2 * kv_width if shape.qkv_bias else 0
    qk_norm = 2 * shape.head_dim if shape.qk_norm else 0
    return attention_weights(shape) + bias + qk_norm


def mlp_params(shape: ModelShape) -> int:
    """One layer's MLP: gate, up, down (3 * h * i); a mixture of experts has one per expert plus the router."""
    h = shape.hidden_size
    if shape.num_experts:
        return shape.num_experts * 3 * h * shape.moe_intermediate_size + h * shape.num_experts
    return 3 * h * shape.intermediate_size


def count_parameters(shape: ModelShape) -> int:
    """Embeddings, every layer's attention, MLP and two norms, the final norm, and the LM head unless tied."""
    h = shape.hidden_size
    embeddings = shape.vocab_size * h
    per_layer = attention_params(shape) + mlp_params(shape) + 2 * h
    lm_head = 0 if shape.tie_embeddings else shape.vocab_size * h
    return embeddings + shape.num_layers * per_layer + h + lm_head


def dense_linear_params(shape: ModelShape) -> int:
    """The weights the CPU fast path re-lays out (graft/cpu/lean.py): attention, dense MLPs, LM head;
    experts stay as they are."""
    mlp = 0 if shape.num_experts else mlp_params(shape)
    return shape.num_layers * (attention_weights(shape) + mlp) + shape.vocab_size * shape.hidden_size


def check_declared_shape(shape: dict) -> None:
    """A model config's `shape`: known keys only (a misspelt one would silently mis-size the plan), and
    enough of them to compute a plan."""
    for key in shape:
        if key not in SHAPE_KEYS:
            raise ConfigError(
                f"unknown key '{key}' in model.shape; allowed keys: {', '.join(SHAPE_KEYS)}"
                + suggest(key, list(SHAPE_KEYS))
            )
    try:
        ModelShape.from_hf_config(shape)
    except ValueError as err:
        raise ConfigError(f"model.shape: {err}") from err
