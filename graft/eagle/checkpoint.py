"""Reading and writing EAGLE head checkpoints in the published layouts, with every key checked.

Layouts (config.json + model.safetensors or pytorch_model.bin, from a local directory or a Hub id):
- EAGLE repository, EAGLE-3: `architectures: [LlamaForCausalLM]`, `num_hidden_layers: 1`,
  `draft_vocab_size` (and optionally `target_hidden_size`).
- SpecForge / SGLang, EAGLE-3: `architectures: [LlamaForCausalLMEagle3]`, `target_hidden_size`,
  optional `eagle_config.eagle_aux_hidden_state_layer_ids` (the layers whose outputs are fused).
- EAGLE-1/2: no `draft_vocab_size`; `fc` (2H -> H, with bias) and `layers.0`.
Unlike the reference loader (strict=False), a missing or unexpected weight is an error listing the
keys, and a head that does not fit the target is refused with both shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from graft.eagle.head import DraftHead, HeadConfig
from graft.models import looks_local

IGNORED_SUFFIXES = ("embed_tokens.weight", "rotary_emb.inv_freq")  # the target's embeddings; derived buffers


class HeadLoadError(ValueError):
    pass


REPO = Path(__file__).resolve().parents[2]


def _local_dir(source: str) -> Path:
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if not path.is_absolute() and (REPO / path).is_dir():  # heads shipped in the repository
        return REPO / path
    if looks_local(source):
        raise HeadLoadError(f"draft head {source}: no such directory")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=["config.json", "*.safetensors", "*.bin"]))
    except Exception as err:  # the Hub client raises many types; one sentence is what helps
        raise HeadLoadError(
            f"could not fetch the draft head '{source}' from the Hugging Face Hub ({type(err).__name__}); "
            "without Hub access, download it elsewhere and pass method.head=/local/dir"
        ) from None


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
    layer_ids = []
    if eagle3:
        aux = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        # SpecForge names the layers whose outputs it fuses; the output of layer i is the input of i + 1
        layer_ids = [i + 1 for i in aux] if aux else default_layer_ids(target_config.num_hidden_layers)
    return HeadConfig(
        kind="eagle3" if eagle3 else "eagle1",
        hidden_size=hidden,
        num_heads=raw["num_attention_heads"],
        num_kv_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
        intermediate_size=raw["intermediate_size"],
        vocab_size=target_config.vocab_size,
        draft_vocab_size=raw.get("draft_vocab_size", target_config.vocab_size),
        target_hidden_size=target_hidden,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=raw.get("rope_theta", 10000.0),
        fc_bias=bool(raw.get("bias", True)) if not eagle3 else False,
        layer_ids=layer_ids,
        attention_head_dim=raw.get("head_dim"),
    )


def load_into(head: DraftHead, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into `head`, refusing missing, unexpected and wrongly shaped weights by name."""
    state = {k.removeprefix("model."): v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}
    expected = head.state_dict()
    if head.cfg.kind == "eagle3" and head.cfg.draft_vocab_size == head.cfg.vocab_size:
        # the reference drops the vocabulary maps when the vocabularies are equal
        state.setdefault("d2t", torch.zeros_like(expected["d2t"]))
        state.setdefault("t2d", torch.ones_like(expected["t2d"]))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadLoadError(
            f"head weights do not match a {head.cfg.kind} head: missing {missing}, unexpected {unexpected}"
        )
    wrong = [
        f"{k}: expected {tuple(expected[k].shape)}, got {tuple(v.shape)}"
        for k, v in state.items()
        if v.shape != expected[k].shape
    ]
    if wrong:
        raise HeadLoadError("head weights have the wrong shape: " + "; ".join(wrong))
    head.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def load_head(source: str, target, dtype=None) -> DraftHead:
    """The head at `source` (Hub id or local directory) for `target` (a graft.backends.TargetBackend)."""
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
    """Write `head` as `layout` ('eagle' or 'specforge'; EAGLE-1 heads always in the EAGLE layout)."""
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
        "max_position_embeddings": 8192,
    }
    if cfg.kind == "eagle1":
        raw.update(architectures=["LlamaForCausalLM"], bias=cfg.fc_bias)
    elif layout == "specforge":
        raw.update(
            architectures=["LlamaForCausalLMEagle3"],
            draft_vocab_size=cfg.draft_vocab_size,
            target_hidden_size=cfg.target_hidden_size,
            eagle_config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.layer_ids]},
        )
    else:
        raw.update(
            architectures=["LlamaForCausalLM"],
            draft_vocab_size=cfg.draft_vocab_size,
            target_hidden_size=cfg.target_hidden_size,
        )
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}, str(directory / "model.safetensors")
    )
    return directory


def head_config_for(
    config, kind: str = "eagle3", draft_vocab: int | None = None, layer_ids: list[int] | None = None
) -> HeadConfig:
    """A head shaped like one decoder layer of the target `config` (for training or random heads)."""
    rope = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get(
        "rope_theta", 10000.0
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
        rope_theta=float(rope),
        layer_ids=list(layer_ids or (default_layer_ids(config.num_hidden_layers) if kind == "eagle3" else [])),
        attention_head_dim=getattr(config, "head_dim", None),
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
