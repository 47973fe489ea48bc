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

from graft.config.schema import HardwareConfig, ModelConfig
from graft.hub import REPO
from graft.schema import ConfigError, coerce_dataclass

STAGES = ("generate", "features", "fit", "export", "all")

# a trainer's counts and files, checked before anything loads: key -> (accepts the value, what is allowed);
# a key the trainer's config lacks (the other trainer's) is skipped
_whole = lambda least: lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least  # noqa: E731
_positive = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0  # noqa: E731
_layers = lambda v: v is None or (isinstance(v, list) and len(v) > 0 and all(_whole(0)(i) for i in v))  # noqa: E731
TRAIN_CHECKS = {
    "train.stage": (lambda v: v in STAGES, "one of " + ", ".join(STAGES)),
    "train.seed": (_whole(0), "an integer >= 0"),
    "train.data.max_len": (_whole(2), "an integer >= 2 (tokens of a prompt and its answer)"),
    "train.data.max_new_tokens": (_whole(1), "an integer >= 1"),
    "train.data.generate_batch": (_whole(1), "an integer >= 1"),
    "train.data.soft_top_k": (_whole(0), "an integer >= 0 (0: hard labels only)"),
    "train.head.draft_vocab": (_whole(1), "an integer >= 1 (token ids the head drafts from)"),
    "train.head.layer_ids": (_layers, "null or a non-empty list of layer ids >= 0"),
    "train.drafter.num_layers": (_whole(1), "an integer >= 1"),
    "train.drafter.num_features": (_whole(1), "an integer >= 1 (target layers the drafter reads)"),
    "train.drafter.layer_ids": (_layers, "null or a non-empty list of layer ids >= 0"),
    "train.drafter.block_size": (_whole(2), "an integer >= 2 (the committed token and at least one slot)"),
    "train.fit.epochs": (_whole(1), "an integer >= 1"),
    "train.fit.warmup_steps": (_whole(0), "an integer >= 0 (0: no warm-up)"),
    "train.fit.batch_sequences": (_whole(1), "an integer >= 1"),
    "train.fit.lr": (_positive, "a number > 0"),
    "train.fit.grad_clip": (_positive, "a number > 0"),
    "train.fit.checkpoint_every": (_whole(1), "an integer >= 1 (optimizer steps)"),
    "train.fit.max_minutes": (lambda v: v is None or _positive(v), "null or a number of minutes > 0"),
    "train.fit.anneal": (lambda v: v in ("steps", "time"), "steps or time"),
    "train.fit.ttt_steps": (_whole(1), "an integer >= 1"),
    "train.fit.block_min": (_whole(2), "an integer >= 2"),
    "train.fit.anchors": (_whole(1), "an integer >= 1"),
    "train.fit.gamma": (_positive, "a number > 0"),
    "train.fit.heldout": (_whole(0), "an integer >= 0 (0: none)"),
    "train.fit.heldout_pool": (lambda v: v is None or _whole(1)(v), "null or an integer >= 1"),
    "train.fit.eval_every": (_whole(1), "an integer >= 1 (optimizer steps)"),
    "train.fit.keep": (lambda v: v in ("best", "last"), "best or last"),
    "train.fit.init_from": (
        lambda v: v is None or Path(v).expanduser().is_file(),
        "null or an existing checkpoint file",
    ),
    "train.data.conversations": (
        lambda v: v is None or Path(v).expanduser().is_file(),
        "null (generate them) or an existing conversations.jsonl",
    ),
}


def check_train_config(cfg) -> None:
    """Every count and file of a trainer's config (TRAIN_CHECKS), before the target loads: one ConfigError
    naming the key, the value and what is allowed, instead of a division by zero or a stage quietly skipped."""
    missing = object()
    for key, (accepts, allowed) in TRAIN_CHECKS.items():
        value = OmegaConf.select(cfg, key, default=missing)
        if value is not missing and not accepts(value):
            raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")
    fit = cfg.train.fit
    if "block_max" in fit and fit.block_max < fit.block_min:
        raise ConfigError(
            f"train.fit.block_max={fit.block_max!r} is below train.fit.block_min={fit.block_min}; expected >= it"
        )


def load_saved(path, **kwargs):
    """torch.load of a trainer's own file (a checkpoint, feature shard, token counts); a torn or foreign one
    is one error naming the file, instead of the unpickler's or zip reader's message alone."""
    try:
        return torch.load(path, **kwargs)
    except FileNotFoundError:
        raise
    except Exception as err:  # pickle, zip and EOF errors alike
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"{path}: not a readable PyTorch file ({type(err).__name__}: {detail})") from None


def setup(cfg) -> tuple[ModelConfig, HardwareConfig, HardwareConfig, Path]:
    """(model, hardware, plain hardware, out_dir) of a trainer's config, checked (check_train_config), out_dir
    made. The plain hardware runs transformers' unmodified modules (autograd and HF generate need them) on as
    many threads."""
    check_train_config(cfg)
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
    if not records:  # load_features refuses this first; a fit of nothing would divide by zero steps
        raise ConfigError(f"no records to fit under {out}")
    optimizer = torch.optim.AdamW(
        module.parameters(), lr=fit.lr, betas=(0.9, 0.95), weight_decay=fit.get("weight_decay", 0.0)
    )
    per_epoch = math.ceil(len(records) / fit.batch_sequences)
    total_steps = per_epoch * fit.epochs
    by_time = fit.anneal == "time" and fit.max_minutes is not None
    time_share = [0.0]  # share of max_minutes used, when the cosine anneals over time

    def schedule(index: int) -> float:
        done = max(index / total_steps, time_share[0])
        warm = min(1.0, (index + 1) / fit.warmup_steps) if fit.warmup_steps else 1.0  # 0: no warm-up
        return warm * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    ckpt_path = out / "checkpoint.pt"
    state = _resume(ckpt_path, module, key, optimizer=optimizer, scheduler=scheduler, init_from=init_from)
    if ckpt_path.exists():
        print(f"resumed at step {state['step']} of {total_steps}")
    elif init_from:
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
        batch = _batch(records, cfg.train.seed + epoch, position=position, size=fit.batch_sequences)
        loss, metrics, progress = step(batch, state["step"])
        _optimize(loss, module, optimizer=optimizer, scheduler=scheduler, grad_clip=fit.grad_clip)
        state["step"] += 1
        record = {"step": state["step"], "epoch": epoch, "loss": float(loss.detach()), "lr": scheduler.get_last_lr()[0]}
        _log({**record, **metrics}, log_path, logger)
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
            saved = {key: module.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            torch.save({**saved, "state": dict(state, seconds=elapsed)}, ckpt_path)
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


def _optimize(loss, module, *, optimizer, scheduler, grad_clip: float) -> None:
    """One optimizer step on `loss`, the gradients clipped to `grad_clip`, and the learning rate's step."""
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()


def _batch(records: list[dict], seed: int, *, position: int, size: int) -> list[dict]:
    """The `position`-th batch of `size` records in the epoch's order, the records shuffled by `seed`."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    return [records[i] for i in order[position * size : (position + 1) * size]]


def _resume(ckpt_path: Path, module, key: str, *, optimizer, scheduler, init_from) -> dict:
    """The fit's state ({"step", "seconds", ...}): resumed from `ckpt_path` where it exists (the module's weights
    under `key`, the optimizer's and the scheduler's), else a fresh one, the weights warm-started from
    `init_from` where given."""
    if ckpt_path.exists():
        saved = load_saved(ckpt_path, weights_only=False)
        module.load_state_dict(saved[key])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        return saved["state"]
    if init_from:  # warm start: weights of an earlier run (its path, or its state loaded), fresh optimizer
        saved = init_from if isinstance(init_from, dict) else load_saved(init_from, weights_only=False)
        module.load_state_dict(saved[key] if key in saved else saved)
    return {"step": 0, "seconds": 0.0}


def _log(record: dict, log_path: Path, logger) -> None:
    """One metrics.jsonl line, and the same figures to W&B where it logs, at the record's step."""
    with open(log_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if logger:
        logger.log(record, step=record["step"])


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
    _log(record, log_path, logger)
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
