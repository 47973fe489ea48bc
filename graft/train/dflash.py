"""Train a DFlash-style block drafter for a target of this harness (Hydra config: configs/train_dflash.yaml,
configs/train/dflash.yaml).

    python -m graft.train dflash [model=smollm2_135m] [train.stage=all] [train.fit.max_minutes=60]

Stages, each resumable (rerun the same command to continue):
- generate: the EAGLE-3 trainer's data stage (graft/train/generate.py): the target answers non-evaluation
  prompts itself, greedily; skipped when train.data.conversations names an existing file;
- features: one target pass per conversation records the outputs of the drafter's target layers;
- fit: random anchor blocks of block_min .. block_max positions, loss weights decaying with the position
  in the block (graft/draft_models/dflash/train.py), in the shared fit loop (graft/train/fit.py) with held-out
  evaluations, checkpointing;
- export: the drafter in the published DFlash layout (config.json + model.safetensors), loadable by
  method=dflash with method.checkpoint=<dir>.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from graft.backends.target import HiddenTap
from graft.config.hydra_setup import CONFIG_DIR
from graft.run.commands import one_line_errors
from graft.schema import ConfigError
from graft.train.features import batch_tensors, load_features, stage_features
from graft.train.fit import export, fit_loop, load_saved, setup
from graft.train.generate import stage_generate


def conversations_path(cfg, out: Path) -> Path:
    given = cfg.train.data.conversations
    return Path(given).expanduser() if given else out / "conversations.jsonl"


def drafter_config(cfg, target):
    from graft.draft_models.dflash.checkpoint import block_config_for

    d = cfg.train.drafter
    layers = target.config.num_hidden_layers
    if d.layer_ids and max(d.layer_ids) >= layers:
        raise ConfigError(
            f"train.drafter.layer_ids={list(d.layer_ids)} is not allowed; expected layer ids in 0..{layers - 1}"
        )
    return block_config_for(
        target.config,
        num_layers=d.num_layers,
        block_size=d.block_size,
        layer_ids=list(d.layer_ids) if d.layer_ids else None,
        num_features=d.num_features,
        mask_token_id=d.mask_token_id,
    )


def split_heldout(records: list[dict], count: int, seed: int, pool: int | None = None) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded choice of `count` records kept out of the fit to choose its weights by, drawn
    from the first `pool` records (all when None), so that data appended later keeps the same held-out set."""
    order = torch.randperm(
        min(pool or len(records), len(records)), generator=torch.Generator().manual_seed(seed)
    ).tolist()
    kept = set(order[: min(count, len(records) - 1)])
    return [r for i, r in enumerate(records) if i not in kept], [r for i, r in enumerate(records) if i in kept]


def stage_fit(cfg, plain, out: Path) -> dict:
    from graft.draft_models.dflash.model import BlockDrafter
    from graft.draft_models.dflash.train import (
        block_accepted,
        block_losses,
        expected_accepted,
        grown_state,
        sample_anchors,
    )

    fit = cfg.train.fit
    records, soft = load_features(cfg, out)
    records, heldout = split_heldout(records, fit.heldout, cfg.train.seed, fit.heldout_pool)
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
        saved = load_saved(init_from, weights_only=False)
        init_from = {"model": grown_state(saved.get("model", saved), model)}

    def step(batch: list[dict], index: int):
        tokens, valid, feats, soft_args = batch_tensors(batch, soft)
        generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + index)
        block = int(torch.randint(fit.block_min, fit.block_max + 1, (1,), generator=generator))
        anchors = sample_anchors(valid, fit.anchors, generator)
        loss, accs, counts = block_losses(
            model, embed, lm_head, feats, tokens, valid, anchors, block, fit.gamma, **soft_args
        )
        metrics = {"block": block, "expected_tau": expected_accepted(accs)}
        metrics.update({f"acc_{k + 1}": acc for k, acc in enumerate(accs)})
        return loss, metrics, {"acc1": f"{accs[0]:.2f}", "acc3": f"{accs[min(2, len(accs) - 1)]:.2f}"}  # blocks of 2+

    def evaluate() -> dict:
        """Chain acceptance on the held-out conversations at the exported block size, fixed anchors."""
        generator = torch.Generator().manual_seed(cfg.train.seed)
        accepted = []
        for start in range(0, len(heldout), fit.batch_sequences):
            tokens, valid, feats, _ = batch_tensors(heldout[start : start + fit.batch_sequences], soft=False)
            anchors = sample_anchors(valid, fit.anchors, generator)
            block_size = cfg.train.drafter.block_size
            accepted.append(block_accepted(model, embed, lm_head, feats, tokens, valid, anchors, block_size).flatten())
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
        saved = load_saved(out / "best.pt", weights_only=False)
        model.load_state_dict(saved["model"])
        print(f"kept the weights of step {saved['best']['step']} (held-out tau {saved['best']['score']:.3f})")
    return {"model": model, **fitted}


def save(model, directory: Path) -> Path:
    from graft.draft_models.dflash.checkpoint import save_block_drafter

    return save_block_drafter(model, directory)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train_dflash")
@one_line_errors  # a bad count or file: one line and exit 2, as run.py (graft/run/commands.py)
def main(cfg: DictConfig) -> None:
    from graft.load.models import load_model

    model_cfg, hardware_cfg, plain_hardware, out = setup(cfg)
    stage = cfg.train.stage
    plain = load_model(model_cfg, plain_hardware)  # autograd and HF generate need the unmodified modules
    conversations = conversations_path(cfg, out)
    if stage in ("generate", "all") and not (cfg.train.data.conversations and conversations.exists()):
        stage_generate(cfg, plain, out)
    if stage in ("features", "all"):
        loaded = load_model(model_cfg, hardware_cfg)
        layer_ids = drafter_config(cfg, loaded.target).target_layer_ids
        stage_features(cfg, loaded.target, conversations, out, tuple(HiddenTap(i, "output") for i in layer_ids))
        (out / "features" / "layers.json").write_text(json.dumps({"target_layer_ids": layer_ids, "where": "output"}))
        del loaded
    if stage in ("fit", "export", "all"):
        fitted = stage_fit(cfg, plain, out)
        if stage in ("export", "all") or fitted["steps"] > 0:
            export(cfg, fitted, "model", save)
