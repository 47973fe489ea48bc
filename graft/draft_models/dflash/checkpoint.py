"""Reading and writing block drafters in the published DFlash layout, with every key checked.

The layout (z-lab's checkpoints, e.g. z-lab/Qwen3-8B-DFlash-b16): config.json with a Qwen3 config
(`model_type: qwen3`, `architectures: [DFlashDraftModel]`, hidden_size, heads, head_dim, ...) plus
`block_size`, `num_target_layers` and `dflash_config: {target_layer_ids, mask_token_id}` (some
checkpoints put the last two at the top level), and model.safetensors. The reference loads it through
trust_remote_code; here the config is read field by field, and a missing, unexpected or wrongly shaped
weight is refused by name. DFlash2 checkpoints (convolutions and a candidate selector) are a different
architecture and are refused for their extra keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from graft.draft_models.dflash.model import BlockConfig, BlockDrafter, spread_layer_ids
from graft.draft_models.eagle.checkpoint import HeadLoadError, _local_dir, load_checked, read_state_dict, rope_fields

DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


class BlockLoadError(HeadLoadError):
    """A block drafter that cannot be read or does not fit the target (one line, no traceback)."""


def _draft_value(raw: dict, name: str, default=None):
    return (raw.get("dflash_config") or {}).get(name, raw.get(name, default))


def _integer(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A config field meant as an integer: 8.7, "8", true or a value out of range are refused by name, since
    int() would quietly truncate or accept them."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f" >= {minimum}" if maximum is None else f" in {minimum}..{maximum}"
        raise BlockLoadError(
            f"config.json {name}={value!r}: expected an integer{bounds if minimum is not None else ''}"
        )
    return value


def block_config(raw: dict, target_config) -> BlockConfig:
    """Interpret a DFlash config.json against the target it drafts for."""
    hidden = raw["hidden_size"]
    if hidden != target_config.hidden_size:
        raise BlockLoadError(
            f"the block drafter is {hidden} wide, the target {target_config.hidden_size}: it reads the target's "
            "embeddings and LM head, so the widths must match"
        )
    vocab = raw.get("vocab_size", target_config.vocab_size)
    if vocab != target_config.vocab_size:
        raise BlockLoadError(
            f"the block drafter's vocabulary is {vocab} tokens, the target's {target_config.vocab_size}"
        )
    layer_ids = _draft_value(raw, "target_layer_ids")
    if not layer_ids or not isinstance(layer_ids, list):
        raise BlockLoadError("config.json names no dflash_config.target_layer_ids (the target layers it reads)")
    target_layers = target_config.num_hidden_layers
    layer_ids = [_integer(i, "dflash_config.target_layer_ids", 0, target_layers - 1) for i in layer_ids]
    mask_token_id = _draft_value(raw, "mask_token_id")
    if mask_token_id is None:
        raise BlockLoadError("config.json names no dflash_config.mask_token_id (the token a block's slots hold)")
    mask_token_id = _integer(mask_token_id, "dflash_config.mask_token_id", 0, target_config.vocab_size - 1)
    if "block_size" not in raw:  # the size it was trained for: no default could stand in for it
        raise BlockLoadError("config.json names no block_size (positions per block the drafter was trained on)")
    block_size = _integer(raw["block_size"], "block_size", 2)  # the committed token and at least one slot
    declared = raw.get("num_target_layers", target_layers)
    if declared != target_layers:
        raise BlockLoadError(
            f"the block drafter was trained for a {declared}-layer target; this target has {target_layers} layers"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise BlockLoadError(f"hidden_act={raw['hidden_act']!r}: only silu is implemented for block drafters")
    kinds = set(raw.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"} or raw.get("use_sliding_window"):
        raise BlockLoadError(f"layer_types {sorted(kinds)}: only full-attention block drafters are implemented")
    rope_theta, rope_scaling = rope_fields(raw)
    kept = {k: raw[k] for k in ("torch_dtype", "dtype", "bos_token_id", "eos_token_id") if k in raw}
    return BlockConfig(
        hidden_size=hidden,
        num_heads=raw["num_attention_heads"],
        num_kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        target_layer_ids=layer_ids,
        block_size=block_size,
        mask_token_id=mask_token_id,
        vocab_size=target_config.vocab_size,
        num_target_layers=target_layers,
        attention_head_dim=raw.get("head_dim"),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=raw.get("max_position_embeddings"),
        attention_bias=bool(raw.get("attention_bias", False)),
        extra=kept,
    )


def load_into(model: BlockDrafter, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `model`, refusing missing, unexpected and wrongly shaped weights by name."""
    state = {k.removeprefix("model."): v for k, v in state.items() if not k.endswith(DERIVED_SUFFIXES)}
    load_checked(model, state, BlockLoadError, "block drafter weights do not match its config", "block drafter weights")


def load_block_drafter(source: str, target, dtype=None) -> BlockDrafter:
    """The block drafter at `source` (Hub id or local directory) for `target` (a TargetBackend)."""
    directory = _local_dir(source)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise BlockLoadError(f"{directory} has no config.json")
    try:
        raw = json.loads(config_path.read_text())
        cfg = block_config(raw, target.config)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BlockLoadError(f"{config_path}: not valid JSON ({err})") from None
    except KeyError as err:
        raise BlockLoadError(f"{config_path}: missing the key {err}, which a DFlash config needs") from None
    except (TypeError, ValueError) as err:
        if isinstance(err, HeadLoadError):
            raise BlockLoadError(f"{config_path}: {err}") from None
        raise BlockLoadError(f"{config_path}: a value has the wrong type ({err})") from None
    model = BlockDrafter(cfg)
    load_into(model, read_state_dict(directory))
    return model.to(device=target.device, dtype=dtype or target.dtype).eval()


def save_block_drafter(model: BlockDrafter, directory: str | Path) -> Path:
    """Write `model` in the published DFlash layout (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    cfg = model.cfg
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "layer_types": ["full_attention"] * cfg.num_layers,
        "max_position_embeddings": cfg.max_position_embeddings or 8192,
        "num_attention_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_target_layers": cfg.num_target_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "vocab_size": cfg.vocab_size,
        **cfg.extra,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    return directory


def block_config_for(
    config,
    num_layers: int = 1,
    block_size: int = 8,
    layer_ids: list[int] | None = None,
    num_features: int = 3,
    mask_token_id: int | None = None,
    intermediate_size: int | None = None,
) -> BlockConfig:
    """A block drafter shaped like the target `config`'s layers (for training or random drafters); the mask
    token defaults to the last vocabulary id."""
    rope_theta, rope_scaling = rope_fields(
        {
            "rope_parameters": getattr(config, "rope_parameters", None),
            "rope_scaling": getattr(config, "rope_scaling", None),
            "rope_theta": getattr(config, "rope_theta", None),
        }
    )
    layers = config.num_hidden_layers
    ids = list(layer_ids) if layer_ids else spread_layer_ids(layers, min(num_features, max(1, layers - 2)))
    return BlockConfig(
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        intermediate_size=intermediate_size or getattr(config, "intermediate_size", 4 * config.hidden_size),
        num_layers=num_layers,
        target_layer_ids=sorted(set(ids)),
        block_size=block_size,
        mask_token_id=config.vocab_size - 1 if mask_token_id is None else mask_token_id,
        vocab_size=config.vocab_size,
        num_target_layers=layers,
        attention_head_dim=getattr(config, "head_dim", None),
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=getattr(config, "max_position_embeddings", None),
    )


def random_block_drafter(target, seed: int = 0, **shape) -> BlockDrafter:
    """A seeded random-weight block drafter for `target` (tests and smoke runs)."""
    cfg = block_config_for(target.config, **shape)
    torch.manual_seed(seed)
    model = BlockDrafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.ndim > 1 else p.fill_(1.0)
    return model.to(device=target.device, dtype=target.dtype).eval()
