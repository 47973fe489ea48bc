"""The fit both trainers share, and the rest of a trainer's command around it: the typed configs, the W&B
logger and the export.

fit_loop: AdamW, warm-up then a cosine over all epochs (or over train.fit.max_minutes with anneal=time),
sequences shuffled per epoch, resume from out/checkpoint.pt, a metrics.jsonl line per step, checkpoints
every `checkpoint_every` steps and at a time budget, and optionally held-out evaluations that keep the
best weights in out/best.pt. What a step computes is the trainer's (graft/train/eagle3.py, dflash.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from graft.config import REPO, HardwareConfig, ModelConfig
from graft.schema import coerce_dataclass


def setup(cfg) -> tuple[ModelConfig, HardwareConfig, HardwareConfig, Path]:
    """(model, hardware, plain hardware, out_dir) of a trainer's config, out_dir made. The plain hardware
    runs transformers' unmodified modules (autograd and HF generate need them) on as many threads."""
    model_cfg = coerce_dataclass(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    hardware_cfg = coerce_dataclass(HardwareConfig, OmegaConf.to_container(cfg.hardware, resolve=True), "hardware")
    plain = HardwareConfig(name="cpu_plain", fast_path="none", num_threads=hardware_cfg.num_threads)
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return model_cfg, hardware_cfg, plain, out


def fit_loop(
    cfg, module, key: str, records: list[dict], out: Path, step, desc: str, init_from=None, evaluate=None
) -> dict:
    """The fit both trainers share: AdamW, warm-up then a cosine over all epochs (or over
    train.fit.max_minutes with anneal=time), sequences shuffled per epoch, resume from out/checkpoint.pt
    (the module's weights under `key`), a metrics.jsonl line per step, checkpoints every
    `checkpoint_every` steps and at a time budget. step(batch, index) -> (loss, metrics, progress) trains on
    one batch of records: the scalar loss to minimise, the metrics to log after step/epoch/loss/lr, and the
    figures for the progress bar. `init_from`: a checkpoint (its path, or its loaded dict) whose weights
    start a fit that has none yet.
    `evaluate()` -> {"score": higher is better, ...}: run every `fit.eval_every` steps and at the end on
    held-out data; its figures are logged with a `heldout_` prefix and the best-scoring weights are kept in
    out/best.pt (returned as "best": {"step", "score"})."""
    fit = cfg.train.fit
    optimizer = torch.optim.AdamW(
        module.parameters(), lr=fit.lr, betas=(0.9, 0.95), weight_decay=fit.get("weight_decay", 0.0)
    )
    per_epoch = math.ceil(len(records) / fit.batch_sequences)
    total_steps = per_epoch * fit.epochs
    by_time = fit.anneal == "time" and fit.max_minutes is not None
    time_share = [0.0]  # share of max_minutes used, when the cosine anneals over time

    def schedule(index: int) -> float:
        done = max(index / total_steps, time_share[0])
        return min(1.0, (index + 1) / fit.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    ckpt_path = out / "checkpoint.pt"
    state = {"step": 0, "seconds": 0.0}
    if ckpt_path.exists():
        saved = torch.load(ckpt_path, weights_only=False)
        module.load_state_dict(saved[key])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = saved["state"]
        print(f"resumed at step {state['step']} of {total_steps}")
    elif init_from:  # warm start: weights of an earlier run (its path, or its state loaded), fresh optimizer
        saved = init_from if isinstance(init_from, dict) else torch.load(init_from, weights_only=False)
        module.load_state_dict(saved[key] if key in saved else saved)
        print(f"warm start from {fit.get('init_from') or init_from}")
    log_path = out / "metrics.jsonl"
    logger = wandb_logger(cfg, out)
    if state.get("annealed"):  # a time-annealed fit that already reached its end
        total_steps = state["step"]
    time_share[0] = state["seconds"] / (60 * fit.max_minutes) if by_time else 0.0
    started = time.time()
    bar = tqdm(total=total_steps, initial=state["step"], desc=desc)
    module.train()
    while state["step"] < total_steps:
        epoch, position = divmod(state["step"], per_epoch)
        order = list(range(len(records)))
        random.Random(cfg.train.seed + epoch).shuffle(order)
        batch = [records[i] for i in order[position * fit.batch_sequences : (position + 1) * fit.batch_sequences]]
        loss, metrics, progress = step(batch, state["step"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), fit.grad_clip)
        optimizer.step()
        scheduler.step()
        state["step"] += 1
        record = {"step": state["step"], "epoch": epoch, "loss": float(loss.detach()), "lr": scheduler.get_last_lr()[0]}
        record.update(metrics)
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if logger:
            logger.log(record, step=state["step"])
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **progress)
        elapsed = state["seconds"] + time.time() - started
        time_share[0] = elapsed / (60 * fit.max_minutes) if by_time else 0.0
        if time_share[0] >= 1.0:  # annealed to zero at the time budget: the run is complete
            total_steps, state["annealed"] = state["step"], True
        out_of_time = fit.max_minutes is not None and elapsed > 60 * fit.max_minutes and not by_time
        if evaluate is not None and (state["step"] % fit.eval_every == 0 or state["step"] == total_steps):
            _evaluate_and_keep(module, key, evaluate, state, out, log_path, logger)
            module.train()
        if state["step"] % fit.checkpoint_every == 0 or state["step"] == total_steps or out_of_time:
            saved_state = dict(state, seconds=elapsed)
            torch.save(
                {
                    key: module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "state": saved_state,
                },
                ckpt_path,
            )
        if out_of_time:
            print(
                f"stopped after {elapsed / 60:.1f} minutes at step {state['step']} of {total_steps}; rerun to continue"
            )
            break
    bar.close()
    if logger:
        logger.finish()
    module.eval()
    return {"steps": state["step"], "total_steps": total_steps, "sequences": len(records), "best": state.get("best")}


def _evaluate_and_keep(module, key: str, evaluate, state: dict, out: Path, log_path: Path, logger) -> None:
    """One held-out evaluation: logged, and the weights kept in out/best.pt when they score best so far."""
    module.eval()
    with torch.no_grad():
        figures = evaluate()
    record = {"step": state["step"], **{f"heldout_{k}": v for k, v in figures.items()}}
    best = state.get("best")
    if best is None or figures["score"] > best["score"]:
        state["best"] = {"step": state["step"], "score": figures["score"]}
        torch.save({key: module.state_dict(), "best": state["best"]}, out / "best.pt")
    record["heldout_best_step"] = state["best"]["step"]
    with open(log_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if logger:
        logger.log(record, step=state["step"])
    print(f"step {state['step']}: held-out " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))


def wandb_logger(cfg, out: Path):
    if os.environ.get("WANDB_MODE") == "disabled":
        return None
    try:
        import wandb

        return wandb.init(
            project="graft-train",
            mode=os.environ.get("WANDB_MODE", "offline"),
            dir=str(out),
            config=OmegaConf.to_container(cfg, resolve=True),
        )
    except Exception as err:  # logging must not stop training
        print(f"W&B logger unavailable ({err}); metrics go to metrics.jsonl only")
        return None


def export(cfg, fitted: dict, key: str, save) -> Path:
    """fitted[key] in train.export.dtype, written by `save(module, directory)` to train.export.dir."""
    module = fitted[key].to(getattr(torch, cfg.train.export.dtype))
    directory = save(module, REPO / cfg.train.export.dir)  # relative to the repository, where shipped heads live
    print(f"exported {directory} ({fitted['steps']} of {fitted['total_steps']} steps, {fitted['sequences']} sequences)")
    return directory
