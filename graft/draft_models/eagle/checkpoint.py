"""Reading and writing EAGLE head checkpoints in the published layouts, with every key checked.

Layouts (config.json + model.safetensors or pytorch_model.bin, from a local directory or a Hub id):
- EAGLE repository, EAGLE-3: `architectures: [LlamaForCausalLM]`, `num_hidden_layers: 1`,
  `draft_vocab_size` (and optionally `target_hidden_size`).
- SpecForge / SGLang, EAGLE-3: `architectures: [LlamaForCausalLMEagle3]`, `target_hidden_size`,
  optional `eagle_config.eagle_aux_hidden_state_layer_ids` (the layers whose outputs are fused).
- EAGLE-1/2: no `draft_vocab_size`; `fc` (2H -> H, with bias) and `layers.0`.
Unlike the reference loader (strict=False), a missing or unexpected weight is an error listing the
keys, and a head that does not fit the target is refused with both shapes. Every field the published
head configs carry, and how it is honoured here: docs/published_heads.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from graft.draft_models.eagle.head import DraftHead, HeadConfig
from graft.hub import Unavailable, checkpoint_dir, looks_local

DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers recomputed from the config
# A head as wide as its target reads the target's own token embeddings: EAGLE and SpecForge freeze the copy a
# checkpoint may carry, so it holds the target's table and is skipped rather than kept twice in memory.
TARGET_EMBEDDINGS = "embed_tokens.weight"
ROPE_TYPES = ("llama3", "linear", "yarn")  # scalings whose frequencies do not depend on the running length


class HeadLoadError(ValueError):
    pass


def _local_dir(source: str) -> Path:
    """A head's or drafter's directory: local, cached, or fetched (graft.load.resolve fetched it before the target)."""
    try:
        return checkpoint_dir(source)
    except Unavailable as err:
        hint = (
            "" if looks_local(source) else "; without Hub access, download it elsewhere and pass method.head=/local/dir"
        )
        raise HeadLoadError(f"draft head {source}: {err}{hint}") from None


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        state: dict = {}
        for f in files:
            try:
                state.update(load_file(str(f)))
            except Exception as err:  # safetensors raises its own error type for torn or foreign files
                raise HeadLoadError(f"{f}: not a readable safetensors file ({str(err).splitlines()[0]})") from None
        return state
    bins = sorted(directory.glob("*.bin"))
    if bins:
        state = {}
        for f in bins:
            try:
                state.update(torch.load(f, map_location="cpu", weights_only=True))
            except Exception as err:  # pickle, zip and unpickling-policy errors alike
                raise HeadLoadError(f"{f}: not a readable PyTorch weights file ({str(err).splitlines()[0]})") from None
        return state
    raise HeadLoadError(f"{directory} has no .safetensors or .bin weights")


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default taps: the inputs of layers 2, L//2 and L-3 (1, L//2, L-1 below 8 layers,
    where those would coincide)."""
    ids = sorted({2, num_layers // 2, num_layers - 3} if num_layers >= 8 else {1, num_layers // 2, num_layers - 1})
    if len(ids) != 3 or min(ids) < 0:
        raise HeadLoadError(f"a {num_layers}-layer target has no three distinct default EAGLE-3 layers; give layer ids")
    return ids


def rope_fields(raw: dict) -> tuple[float, dict | None]:
    """(rope_theta, scaling) from a config in transformers 4 form (rope_theta and rope_scaling) or 5 form
    (rope_parameters, rope_theta folded in); scaling is None for the plain rotary embedding, else a copy of
    the scaling dict with rope_type named (older configs say type)."""
    params = raw.get("rope_parameters")
    scaling = dict(params if params is not None else raw.get("rope_scaling") or {})
    theta = scaling.pop("rope_theta", None) or raw.get("rope_theta") or 10000.0  # EAGLE's and LlamaConfig's default
    if any(isinstance(v, dict) for v in scaling.values()):
        raise HeadLoadError(f"rope parameters per layer type ({sorted(scaling)}): a draft head has one layer")
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise HeadLoadError(
            f"partial_rotary_factor={scaling['partial_rotary_factor']}: the head rotates every dimension"
        )
    if kind == "default":
        return float(theta), None
    if kind not in ROPE_TYPES:
        raise HeadLoadError(
            f"rope type {kind!r} is not supported for draft heads (supported: default, {', '.join(ROPE_TYPES)}); "
            "dynamic and longrope change the frequencies with the sequence length, which the head's cached "
            "rotary table does not follow"
        )
    return float(theta), {"rope_type": kind, **scaling}


def head_config(raw: dict, target_config) -> HeadConfig:
    """Interpret a head's config.json against the target it will draft for."""
    archs = raw.get("architectures") or []
    eagle3 = "draft_vocab_size" in raw or any("Eagle3" in a for a in archs)
    hidden = raw["hidden_size"]
    target_hidden = raw.get("target_hidden_size") or hidden
    if target_hidden != target_config.hidden_size:
        raise HeadLoadError(
            f"the head reads target features of width {target_hidden}, but the target's hidden size is {target_config.hidden_size}"
        )
    if raw.get("vocab_size", target_config.vocab_size) != target_config.vocab_size:
        raise HeadLoadError(
            f"the head's vocabulary is {raw['vocab_size']} tokens, the target's {target_config.vocab_size}"
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise HeadLoadError(
            f"hidden_act={act!r}: only silu is implemented for draft heads (every published head uses it)"
        )
    eagle_config = raw.get("eagle_config") or {}
    if eagle_config.get("use_aux_hidden_state") is False:
        raise HeadLoadError("eagle_config.use_aux_hidden_state=false: the head would read only the target's last layer")
    if raw.get("fc_norm") or raw.get("norm_output") is False:
        raise HeadLoadError("fc_norm / norm_output=false (EAGLE-3.1 variants) are not implemented for draft heads")
    layer_ids = []
    if eagle3:
        aux = eagle_config.get("eagle_aux_hidden_state_layer_ids")
        # SpecForge names the layers whose outputs it fuses; the output of layer i is the input of i + 1
        layer_ids = [i + 1 for i in aux] if aux else default_layer_ids(target_config.num_hidden_layers)
    rope_theta, rope_scaling = rope_fields(raw)
    return HeadConfig(
        kind="eagle3" if eagle3 else "eagle1",
        hidden_size=hidden,
        num_heads=raw["num_attention_heads"],
        num_kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
        intermediate_size=raw["intermediate_size"],
        vocab_size=target_config.vocab_size,
        draft_vocab_size=raw.get("draft_vocab_size") or target_config.vocab_size,
        target_hidden_size=target_hidden,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        fc_bias=bool(raw.get("bias", True)) if not eagle3 else False,
        layer_ids=layer_ids,
        attention_head_dim=raw.get("head_dim"),
        rope_scaling=rope_scaling,
        max_position_embeddings=raw.get("max_position_embeddings"),
        attention_bias=bool(raw.get("attention_bias", False)),
        qkv_bias=bool(raw.get("qkv_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
    )


def load_into(head: DraftHead, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `head`, refusing missing, unexpected and wrongly shaped weights by name."""
    state = {k.removeprefix("model."): v for k, v in state.items() if not k.endswith(DERIVED_SUFFIXES)}
    if not head.cfg.own_embeddings:
        state.pop(TARGET_EMBEDDINGS, None)
    expected = head.state_dict()
    if head.cfg.kind == "eagle3" and head.cfg.draft_vocab_size == head.cfg.vocab_size:
        # the reference drops the vocabulary maps when the vocabularies are equal
        state.setdefault("d2t", torch.zeros_like(expected["d2t"]))
        state.setdefault("t2d", torch.ones_like(expected["t2d"]))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    biases = [k for k in missing + unexpected if k.endswith(".bias") and not k.startswith("fc.")]
    hint = " (attention_bias, qkv_bias and mlp_bias in config.json say which projections have biases)" if biases else ""
    load_checked(head, state, HeadLoadError, f"head weights do not match a {head.cfg.kind} head", "head weights", hint)


def load_checked(module, state: dict, error: type, mismatch: str, what: str, hint: str = "") -> None:
    """Load `state` into `module` strictly, in the module's dtypes, after raising `error` that names every
    missing, unexpected ("<mismatch>: missing [...], unexpected [...]<hint>") or wrongly shaped key."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise error(f"{mismatch}: missing {missing}, unexpected {unexpected}{hint}")
    wrong = [
        f"{k}: expected {tuple(expected[k].shape)}, got {tuple(v.shape)}"
        for k, v in state.items()
        if v.shape != expected[k].shape
    ]
    if wrong:
        raise error(f"{what} have the wrong shape: " + "; ".join(wrong))
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def load_head(source: str, target, dtype=None) -> DraftHead:
    """The head at `source` (Hub id or local directory) for `target` (a graft.backends.target.TargetBackend)."""
    directory = _local_dir(source)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise HeadLoadError(f"{directory} has no config.json")
    try:
        raw = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HeadLoadError(f"{config_path}: not valid JSON ({err})") from None
    try:
        cfg = head_config(raw, target.config)
    except KeyError as err:
        raise HeadLoadError(f"{config_path}: missing the key {err}, which an EAGLE head config needs") from None
    except TypeError as err:
        raise HeadLoadError(f"{config_path}: a value has the wrong type ({err})") from None
    head = DraftHead(cfg, target_lm_head=target.lm_head)
    load_into(head, read_state_dict(directory))
    return head.to(device=target.device, dtype=dtype or target.dtype).eval()


def save_head(head: DraftHead, directory: str | Path, layout: str = "eagle") -> Path:
    """Write `head` as `layout` ('eagle' or 'specforge'; EAGLE-1 heads always in the EAGLE layout), so that
    EAGLE's and SpecForge's own loaders find every weight they expect.

    EAGLE's loader (eagle/model/cnets.py, EAGLE-3 Model) copies the target's token embeddings into the head
    only when the config has no `target_hidden_size`, and then loads the file with strict=False: a config
    naming target_hidden_size with no embed_tokens in the file leaves the head's embeddings random there.
    So target_hidden_size is written only for a head narrower or wider than its target, whose own table
    (embed_tokens) is then in the file; SpecForge reads a missing target_hidden_size as hidden_size."""
    from safetensors.torch import save_file

    cfg = head.cfg
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = {
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings or 8192,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
    }
    if cfg.qkv_bias:
        raw["qkv_bias"] = True
    if cfg.rope_scaling is not None:
        raw["rope_scaling"] = dict(cfg.rope_scaling)
    if cfg.kind == "eagle1":
        raw.update(architectures=["LlamaForCausalLM"], bias=cfg.fc_bias)
    elif layout == "specforge":
        raw.update(
            architectures=["LlamaForCausalLMEagle3"],
            draft_vocab_size=cfg.draft_vocab_size,
            eagle_config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.layer_ids]},
        )
    else:
        raw.update(architectures=["LlamaForCausalLM"], draft_vocab_size=cfg.draft_vocab_size)
    if cfg.own_embeddings:
        raw["target_hidden_size"] = cfg.target_hidden_size
    state = head.state_dict()
    if cfg.kind == "eagle3" and layout == "eagle" and cfg.draft_vocab_size == cfg.vocab_size:
        # EAGLE's model drops d2t / t2d when the vocabularies are equal (load_into puts the identity back)
        state = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory


def head_config_for(
    config, kind: str = "eagle3", draft_vocab: int | None = None, layer_ids: list[int] | None = None
) -> HeadConfig:
    """A head shaped like one decoder layer of the target `config` (for training or random heads): its rotary
    embedding is the target's, scaling included; its layer is a bias-free Llama layer, as EAGLE's and
    SpecForge's draft layers are whatever the target."""
    rope_theta, rope_scaling = rope_fields(
        {
            "rope_parameters": getattr(config, "rope_parameters", None),
            "rope_scaling": getattr(config, "rope_scaling", None),
            "rope_theta": getattr(config, "rope_theta", None),
        }
    )
    return HeadConfig(
        kind=kind,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        intermediate_size=getattr(config, "intermediate_size", 4 * config.hidden_size),
        vocab_size=config.vocab_size,
        draft_vocab_size=draft_vocab or config.vocab_size,
        target_hidden_size=config.hidden_size,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=rope_theta,
        layer_ids=list(layer_ids or (default_layer_ids(config.num_hidden_layers) if kind == "eagle3" else [])),
        attention_head_dim=getattr(config, "head_dim", None),
        rope_scaling=rope_scaling,
        max_position_embeddings=getattr(config, "max_position_embeddings", None),
    )


def random_head(
    target, kind: str = "eagle3", seed: int = 0, layer_ids: list[int] | None = None, draft_vocab: int | None = None
) -> DraftHead:
    """A seeded random-weight head shaped for `target` (a TargetBackend; tests and smoke runs)."""
    cfg = head_config_for(target.config, kind, draft_vocab, layer_ids)
    torch.manual_seed(seed)
    head = DraftHead(cfg, target_lm_head=target.lm_head)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2) if p.ndim > 1 else p.fill_(1.0)
        if kind == "eagle3" and cfg.draft_vocab_size == cfg.vocab_size:
            head.t2d.fill_(True)  # every target token is in the draft vocabulary
        elif kind == "eagle3":
            # draft id i -> target id 2i: an arbitrary but valid map, so the offset path is exercised
            ids = torch.arange(cfg.draft_vocab_size)
            head.d2t.copy_(ids)  # target = i + d2t[i] = 2i
            head.t2d.zero_()
            head.t2d[2 * ids] = True
    return head.to(device=target.device, dtype=target.dtype).eval()
