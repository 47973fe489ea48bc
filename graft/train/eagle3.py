"""Train an EAGLE-3 head for a target of this harness (Hydra config: configs/train.yaml, configs/train/eagle3.yaml).

    python -m graft.train eagle3 [model=smollm2_135m] [train.stage=all] [train.fit.max_minutes=60]

Stages, each resumable (rerun the same command to continue):
- generate: the target answers non-evaluation prompts itself (greedy, graft/train/generate.py): GSM8K
  *train* questions, questions it writes about a list of topics, and code / prose requests composed for
  this project; then second turns: a composed follow-up after its own answer to some of those first turns;
- features: one target pass per conversation records the fused features (inputs of the head's layers);
- fit: training-time test over `ttt_steps` unrolled steps (graft/draft_models/eagle/train.py) in the shared fit loop
  (graft/train/fit.py), checkpointing;
- export: the head in the EAGLE layout (config.json + model.safetensors), loadable by method=eagle3.
"""

from __future__ import annotations

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


def new_head(cfg, target, layer_ids: list[int], counts: torch.Tensor):
    """A fresh head for `target` whose draft vocabulary is the train.head.draft_vocab most frequent answer ids."""
    from graft.draft_models.eagle.checkpoint import head_config_for
    from graft.draft_models.eagle.head import DraftHead
    from graft.draft_models.eagle.train import draft_vocabulary

    head_cfg = head_config_for(target.config, "eagle3", cfg.train.head.draft_vocab, layer_ids)
    head = DraftHead(head_cfg)
    d2t, t2d = draft_vocabulary(counts, head_cfg.draft_vocab_size)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return head


def stage_fit(cfg, loaded, out: Path, layer_ids: list[int]) -> dict:
    from graft.draft_models.eagle.train import ttt_losses

    fit = cfg.train.fit
    records, soft = load_features(cfg, out)
    counts = load_saved(out / "token_counts.pt")
    torch.manual_seed(cfg.train.seed)
    head = new_head(cfg, loaded.target, layer_ids, counts)
    embed = loaded.target.embed
    weights = [fit.step_weight**j for j in range(fit.ttt_steps)]

    def step(batch: list[dict], index: int):
        tokens, valid, feats, soft_args = batch_tensors(batch, soft)
        losses, accs = ttt_losses(head, embed, feats, tokens, valid, fit.ttt_steps, **soft_args)
        loss = sum(w * step_loss for w, step_loss in zip(weights, losses))
        metrics = {f"loss_{j}": float(step_loss) for j, step_loss in enumerate(losses)}
        metrics.update({f"acc_{j}": a for j, a in enumerate(accs)})
        return loss, metrics, {"acc0": f"{accs[0]:.2f}", "acc3": f"{accs[min(3, len(accs) - 1)]:.2f}"}

    fitted = fit_loop(cfg, head, "head", records, out, step, "fit (TTT)", init_from=fit.init_from)
    return {"head": head, **fitted}


def save(head, directory: Path) -> Path:
    from graft.draft_models.eagle.checkpoint import save_head

    return save_head(head, directory, layout="eagle")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
@one_line_errors  # a bad count or file: one line and exit 2, as run.py (graft/run/commands.py)
def main(cfg: DictConfig) -> None:
    from graft.draft_models.eagle.checkpoint import default_layer_ids
    from graft.load.models import load_model

    model_cfg, hardware_cfg, plain_hardware, out = setup(cfg)
    stage = cfg.train.stage
    loaded = load_model(model_cfg, hardware_cfg)
    vocab, layers = loaded.target.vocab_size, loaded.target.num_layers
    if cfg.train.head.draft_vocab > vocab:
        raise ConfigError(
            f"train.head.draft_vocab={cfg.train.head.draft_vocab} is not allowed; expected 1..{vocab}, the target's vocabulary"
        )
    layer_ids = list(cfg.train.head.layer_ids or default_layer_ids(layers))
    if max(layer_ids) >= layers:
        raise ConfigError(f"train.head.layer_ids={layer_ids} is not allowed; expected layer ids in 0..{layers - 1}")
    if stage in ("generate", "all"):
        plain = load_model(model_cfg, plain_hardware)  # HF generate needs the unmodified modules
        stage_generate(cfg, plain, out)
        del plain
    if stage in ("features", "all"):
        taps = tuple(HiddenTap(i, "input") for i in layer_ids)
        counts = stage_features(cfg, loaded.target, out / "conversations.jsonl", out, taps, count_tokens=True)
        torch.save(counts, out / "token_counts.pt")
    if stage in ("fit", "export", "all"):
        fitted = stage_fit(cfg, loaded, out, layer_ids)
        if stage in ("export", "all") or fitted["steps"] > 0:
            export(cfg, fitted, "head", save)
