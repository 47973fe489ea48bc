"""The features stage both trainers share, and the batches their fits read back.

One target pass per conversation (prompt + answer, cut to max_len) records its tokens, which of them are
labels (the answer's), the hidden states at the trainer's taps in float16 and, with soft_top_k > 0, the
target's top-k next-token distribution (the soft labels). Records go 64 to a shard under out/features; a
shard already written (with the soft labels asked for) is kept, so a rerun continues where it stopped.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

from graft.schema import ConfigError
from graft.train.fit import load_saved
from graft.train.generate import jsonl

PER_SHARD = 64


@torch.inference_mode()
def stage_features(cfg, target, conversations: Path, out: Path, taps, count_tokens: bool = False):
    """Feature shards of every conversation in `conversations` under out/features; with `count_tokens`,
    returns how often each target id occurs in the answers ([vocab] long: the draft vocabulary's counts)."""
    convs = conversation_records(conversations)
    shard_dir = out / "features"
    shard_dir.mkdir(exist_ok=True)
    top_k = cfg.train.data.soft_top_k
    counts = torch.zeros(target.vocab_size, dtype=torch.long) if count_tokens else None
    for s, start in enumerate(tqdm(range(0, len(convs), PER_SHARD), desc="target features")):
        chunk = convs[start : start + PER_SHARD]
        if counts is not None:
            for c in chunk:
                counts += torch.bincount(torch.tensor(c["answer_ids"], dtype=torch.long), minlength=target.vocab_size)
        shard = shard_dir / f"shard_{s:04d}.pt"
        if shard.exists():  # a short last shard, or one without the soft labels asked for, is redone
            old = load_saved(shard)
            if len(old) == len(chunk) and (top_k == 0 or "soft_ids" in old[0]):
                continue
        records = [feature_record(target, c, taps, cfg.train.data.max_len, top_k) for c in chunk]
        torch.save(records, shard)
    return counts


def conversation_records(path: Path) -> list[dict]:
    """The conversations a features stage reads: one JSON object a line with prompt_ids and answer_ids (lists of
    token ids); a missing or empty file, or a line without them, is one error naming the file (and line)."""
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such conversations file; the generate stage writes it (train.stage=generate or all)"
        )
    records = jsonl(path)
    for number, record in enumerate(records, 1):
        for key in ("prompt_ids", "answer_ids"):
            ids = record.get(key) if isinstance(record, dict) else None
            whole = isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            if not whole or (key == "prompt_ids" and not ids):
                raise ConfigError(f"{path}: record {number}: '{key}' is not a list of token ids ({ids!r:.60})")
    if not records:
        raise ConfigError(
            f"{path} holds no conversations; the generate stage writes them (train.stage=generate or all)"
        )
    return records


def feature_record(target, conversation: dict, taps, max_len: int, top_k: int) -> dict:
    """One target pass over a conversation (prompt + answer, cut to max_len): its tokens, which of them are
    labels (the answer's), the `taps` hidden states in float16 and, with top_k > 0, the soft labels."""
    ids = (conversation["prompt_ids"] + conversation["answer_ids"])[:max_len]
    target.reset(len(ids) + 8)
    encoded = target.prefill(ids, taps, all_logits=top_k > 0)
    valid = [False] * len(conversation["prompt_ids"]) + [True] * len(conversation["answer_ids"])
    record = {"tokens": torch.tensor(ids), "valid": torch.tensor(valid[: len(ids)]), "features": encoded.hidden.half()}
    if top_k > 0:
        record.update(soft_labels(encoded.logits, top_k))
    return record


def soft_labels(logits: torch.Tensor, top_k: int) -> dict:
    """The target's own next-token distribution at every position, its top-k (logits [T, V]): the soft
    labels of a fit, stored as soft_ids [T, k] int32 and soft_probs [T, k] float16."""
    probs, ids = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    return {"soft_ids": ids.int(), "soft_probs": probs.half()}


def load_features(cfg, out: Path) -> tuple[list[dict], bool]:
    """Every record of out/features, and whether the fit trains on soft labels (asked for, and recorded)."""
    records = [r for shard in sorted((out / "features").glob("shard_*.pt")) for r in load_saved(shard)]
    if not records:  # a fit of nothing would divide by zero steps
        raise ConfigError(
            f"no feature records under {out / 'features'}: run the features stage first (train.stage=features or all)"
        )
    asked = cfg.train.fit.soft_labels
    soft = bool(asked and records and "soft_ids" in records[0])
    if asked and not soft:
        print("note: features hold no soft labels (train.data.soft_top_k=0 when they were made); hard labels used")
    return records, soft


def padded(batch: list[dict], key: str, width: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """records[key] ([T] or [T, ...]) right-padded with zeros along T to `width` and stacked: [B, width, ...]."""
    rows = [r[key] if dtype is None else r[key].to(dtype) for r in batch]
    return torch.stack([torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, width - x.shape[0])) for x in rows])


def batch_tensors(batch: list[dict], soft: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """A batch of records as right-padded tensors: tokens [B, T], valid [B, T], features [B, T, F] float32,
    and, with `soft`, the soft labels as keyword arguments of the losses (soft_ids long, soft_probs float32)."""
    width = max(r["tokens"].shape[0] for r in batch)
    tokens, valid = padded(batch, "tokens", width), padded(batch, "valid", width)
    features = padded(batch, "features", width, torch.float32)
    soft_args = {}
    if soft:
        soft_args = {
            "soft_ids": padded(batch, "soft_ids", width, torch.long),
            "soft_probs": padded(batch, "soft_probs", width, torch.float32),
        }
    return tokens, valid, features, soft_args
