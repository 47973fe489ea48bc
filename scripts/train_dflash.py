"""Train a DFlash-style block drafter for a target of this harness (Hydra config: configs/train_dflash.yaml).

    python scripts/train_dflash.py [model=smollm2_135m] [train.stage=all] [train.fit.max_minutes=60]

Stages, each resumable (rerun the same command to continue):
- generate: the EAGLE-3 trainer's data stage (scripts/train_eagle3.py): the target answers non-evaluation
  prompts itself, greedily; skipped when train.data.conversations names an existing file;
- features: one target pass per conversation records the outputs of the drafter's target layers;
- fit: random anchor blocks of block_min .. block_max positions, loss weights decaying with the position
  in the block (graft/dflash/train.py), checkpointing;
- export: the drafter in the published DFlash layout (config.json + model.safetensors), loadable by
  method=dflash with method.checkpoint=<dir>.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_ERROR_REPORTING", "false")

import hydra  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graft.backends import HiddenTap  # noqa: E402
from graft.config import HardwareConfig, ModelConfig, register_schemas  # noqa: E402
from graft.schema import coerce_dataclass  # noqa: E402
from scripts.train_eagle3 import _jsonl, _padded, feature_record, fit_loop, stage_generate  # noqa: E402


def conversations_path(cfg, out: Path) -> Path:
    given = cfg.train.data.conversations
    return Path(given) if given else out / "conversations.jsonl"


def drafter_config(cfg, target):
    from graft.dflash.checkpoint import block_config_for

    d = cfg.train.drafter
    return block_config_for(
        target.config,
        num_layers=d.num_layers,
        block_size=d.block_size,
        layer_ids=list(d.layer_ids) if d.layer_ids else None,
        num_features=d.num_features,
        mask_token_id=d.mask_token_id,
    )


@torch.inference_mode()
def stage_features(cfg, loaded, out: Path, layer_ids: list[int]) -> None:
    convs = _jsonl(conversations_path(cfg, out))
    shard_dir = out / "features"
    shard_dir.mkdir(exist_ok=True)
    target = loaded.target
    taps = tuple(HiddenTap(i, "output") for i in layer_ids)
    per_shard = 64
    top_k = cfg.train.data.soft_top_k
    for s, start in enumerate(tqdm(range(0, len(convs), per_shard), desc="target features")):
        chunk = convs[start : start + per_shard]
        shard = shard_dir / f"shard_{s:04d}.pt"
        if shard.exists():  # a short last shard, or one without the soft labels asked for, is redone
            old = torch.load(shard)
            if len(old) == len(chunk) and (top_k == 0 or "soft_ids" in old[0]):
                continue
        records = [feature_record(target, c, taps, cfg.train.data.max_len, top_k) for c in chunk]
        torch.save(records, shard)
    (shard_dir / "layers.json").write_text(json.dumps({"target_layer_ids": layer_ids, "where": "output"}))


def split_heldout(records: list[dict], count: int, seed: int, pool: int | None = None) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded choice of `count` records kept out of the fit to choose its weights by, drawn
    from the first `pool` records (all when None), so that data appended later keeps the same held-out set."""
    order = torch.randperm(
        min(pool or len(records), len(records)), generator=torch.Generator().manual_seed(seed)
    ).tolist()
    kept = set(order[: min(count, len(records) - 1)])
    return [r for i, r in enumerate(records) if i not in kept], [r for i, r in enumerate(records) if i in kept]


def stage_fit(cfg, plain, out: Path) -> dict:
    from graft.dflash.model import BlockDrafter
    from graft.dflash.train import block_accepted, block_losses, expected_accepted, grown_state, sample_anchors

    fit = cfg.train.fit
    records = [r for shard in sorted((out / "features").glob("shard_*.pt")) for r in torch.load(shard)]
    records, heldout = split_heldout(records, fit.heldout, cfg.train.seed, fit.heldout_pool)
    soft = fit.soft_labels and "soft_ids" in records[0]
    if fit.soft_labels and not soft:
        print("note: features hold no soft labels (train.data.soft_top_k=0 when they were made); hard labels used")
    torch.manual_seed(cfg.train.seed)
    model = BlockDrafter(drafter_config(cfg, plain.target))
    with torch.no_grad():  # Qwen3's initialisation: normal(0, 0.02) weights, unit norms
        for p in model.parameters():
            p.normal_(0, 0.02) if p.ndim > 1 else p.fill_(1.0)
    for p in plain.target.model.parameters():  # the target's embeddings and LM head are read, never trained
        p.requires_grad_(False)
    embed, lm_head = plain.target.embed, plain.target.lm_head
    init_from = fit.get("init_from")
    if init_from:  # an earlier fit's weights; a drafter with more layers grows from them (grown_state)
        saved = torch.load(init_from, weights_only=False)
        init_from = {"model": grown_state(saved.get("model", saved), model)}

    def step(batch: list[dict], index: int):
        width = max(r["tokens"].shape[0] for r in batch)
        tokens, valid = _padded(batch, "tokens", width), _padded(batch, "valid", width)
        feats = _padded(batch, "features", width, torch.float32)
        generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + index)
        block = int(torch.randint(fit.block_min, fit.block_max + 1, (1,), generator=generator))
        anchors = sample_anchors(valid, fit.anchors, generator)
        soft_args = {}
        if soft:
            soft_args = {
                "soft_ids": _padded(batch, "soft_ids", width, torch.long),
                "soft_probs": _padded(batch, "soft_probs", width, torch.float32),
            }
        loss, accs, counts = block_losses(
            model, embed, lm_head, feats, tokens, valid, anchors, block, fit.gamma, **soft_args
        )
        metrics = {"block": block, "expected_tau": expected_accepted(accs)}
        metrics.update({f"acc_{k + 1}": acc for k, acc in enumerate(accs)})
        return loss, metrics, {"acc1": f"{accs[0]:.2f}", "acc3": f"{accs[2]:.2f}"}

    def evaluate() -> dict:
        """Chain acceptance on the held-out conversations at the exported block size, fixed anchors."""
        generator = torch.Generator().manual_seed(cfg.train.seed)
        accepted = []
        for start in range(0, len(heldout), fit.batch_sequences):
            batch = heldout[start : start + fit.batch_sequences]
            width = max(r["tokens"].shape[0] for r in batch)
            tokens, valid = _padded(batch, "tokens", width), _padded(batch, "valid", width)
            feats = _padded(batch, "features", width, torch.float32)
            anchors = sample_anchors(valid, fit.anchors, generator)
            accepted.append(
                block_accepted(
                    model, embed, lm_head, feats, tokens, valid, anchors, cfg.train.drafter.block_size
                ).flatten()
            )
        tau = 1.0 + float(torch.cat(accepted).float().mean())
        return {"score": tau, "tau": tau}

    fitted = fit_loop(
        cfg,
        model,
        "model",
        records,
        out,
        step,
        "fit (blocks)",
        init_from=init_from,
        evaluate=evaluate if heldout else None,
    )
    if fit.keep == "best" and (out / "best.pt").exists():
        saved = torch.load(out / "best.pt", weights_only=False)
        model.load_state_dict(saved["model"])
        print(f"kept the weights of step {saved['best']['step']} (held-out tau {saved['best']['score']:.3f})")
    return {"model": model, **fitted}


def stage_export(cfg, fitted: dict) -> Path:
    from graft.dflash.checkpoint import save_block_drafter

    model = fitted["model"].to(getattr(torch, cfg.train.export.dtype))
    directory = save_block_drafter(model, ROOT / cfg.train.export.dir)
    print(f"exported {directory} ({fitted['steps']} of {fitted['total_steps']} steps, {fitted['sequences']} sequences)")
    return directory


@hydra.main(version_base="1.3", config_path="../configs", config_name="train_dflash")
def main(cfg: DictConfig) -> None:
    from graft.models import load_model

    model_cfg = coerce_dataclass(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    hardware_cfg = coerce_dataclass(HardwareConfig, OmegaConf.to_container(cfg.hardware, resolve=True), "hardware")
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stage = cfg.train.stage
    plain_hardware = HardwareConfig(name="cpu_plain", fast_path="none", num_threads=hardware_cfg.num_threads)
    plain = load_model(model_cfg, plain_hardware)  # autograd and HF generate need the unmodified modules
    if stage in ("generate", "all") and not (cfg.train.data.conversations and conversations_path(cfg, out).exists()):
        stage_generate(cfg, plain, out)
    if stage in ("features", "all"):
        loaded = load_model(model_cfg, hardware_cfg)
        stage_features(cfg, loaded, out, drafter_config(cfg, loaded.target).target_layer_ids)
        del loaded
    if stage in ("fit", "export", "all"):
        fitted = stage_fit(cfg, plain, out)
        if stage in ("export", "all") or fitted["steps"] > 0:
            stage_export(cfg, fitted)


if __name__ == "__main__":
    register_schemas()
    main()
