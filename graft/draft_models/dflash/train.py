"""Training a block drafter on a target's own answers: random anchor blocks, one forward for all of them.

For a sequence with target features at every position, an anchor a gives the block [token a, mask x
(B - 1)] at positions a .. a + B - 1, which sees the context features of positions < a (what the drafter
has at inference when token a is the last committed one) and the rest of its own block, and predicts the
tokens a + 1 .. a + B - 1. Many anchors of a sequence go through one forward: their blocks are laid side
by side and a mask keeps each block to its own context prefix and its own positions. Block position k's
loss is weighted by exp(-(k - 1) / gamma): an early miss ends the accepted prefix, so the early positions
matter most.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graft.draft_models.dflash.model import BlockDrafter
from graft.layers import apply_rotary


def sample_anchors(valid: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """[B, count] anchor positions per sequence, drawn without replacement (with, when a sequence has fewer)
    among the positions whose next token is a label (valid [B, T]); a sequence with none gets position 0."""
    rows = []
    for row in valid:
        allowed = torch.nonzero(row[1:]).squeeze(1)  # anchor p predicts p + 1 first
        if allowed.numel() == 0:
            rows.append(torch.zeros(count, dtype=torch.long))
            continue
        replace = allowed.numel() < count
        pick = (
            torch.randint(allowed.numel(), (count,), generator=generator)
            if replace
            else torch.randperm(allowed.numel(), generator=generator)[:count]
        )
        rows.append(allowed[pick])
    return torch.stack(rows)


def _rotate(model: BlockDrafter, x: Tensor, positions: Tensor) -> Tensor:
    """x [b, heads, n, d] rotated by positions [b, n]."""
    cos, sin = model.rotary.table(int(positions.max()) + 1, x)
    return apply_rotary(x, cos[positions][:, None], sin[positions][:, None])


def block_hidden(
    model: BlockDrafter, embed, features: Tensor, tokens: Tensor, anchors: Tensor, block_size: int
) -> Tensor:
    """The drafter's final-normed outputs [b, A, B, H] for the block at every anchor [b, A], each block
    seeing the context features [b, T, F] before its anchor and its own positions (tokens [b, T])."""
    cfg = model.cfg
    b, t, _ = features.shape
    a = anchors.shape[1]
    h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    positions = (anchors[:, :, None] + torch.arange(block_size)).reshape(b, a * block_size)  # [b, n]
    block_ids = torch.full((b, a, block_size), cfg.mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = tokens.gather(1, anchors)

    # who sees what: a block position sees the context positions before its anchor and its own block
    ctx_visible = torch.arange(t)[None, None, :] < anchors.repeat_interleave(block_size, dim=1)[:, :, None]  # [b, n, T]
    owner = torch.arange(a).repeat_interleave(block_size)
    own_block = (owner[:, None] == owner[None, :]).expand(b, -1, -1)  # [b, n, n]
    mask = torch.cat([ctx_visible, own_block], dim=-1)[:, None]  # [b, 1, n, T + n]

    ctx = model.context(features)  # [b, T, H]
    ctx_positions = torch.arange(t).expand(b, t)
    x = embed(block_ids.view(b, -1)).to(ctx.dtype)  # [b, n, H]
    n = x.shape[1]
    groups = h // kvh
    for layer in model.layers:
        attn = layer.self_attn
        normed = layer.input_layernorm(x)
        q = _rotate(model, attn.q_norm(attn.q_proj(normed).view(b, n, h, d)).transpose(1, 2), positions)
        kv_in = torch.cat([ctx, normed], dim=1)  # [b, T + n, H]
        kv_pos = torch.cat([ctx_positions, positions], dim=1)
        k = _rotate(model, attn.k_norm(attn.k_proj(kv_in).view(b, t + n, kvh, d)).transpose(1, 2), kv_pos)
        v = attn.v_proj(kv_in).view(b, t + n, kvh, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.reshape(b, kvh, groups * n, d), k, v, attn_mask=mask.repeat(1, 1, groups, 1)
        )  # query heads that share a key/value head folded into the query axis
        x = x + attn.o_proj(out.reshape(b, h, n, d).transpose(1, 2).reshape(b, n, h * d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x).view(b, a, block_size, -1)


def _block_labels(tokens: Tensor, valid: Tensor, anchors: Tensor, block_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """For the block at each anchor [b, A]: the text position of each block position (clamped into the
    text), the text's token there, and whether it is a label (an answer token inside the text; never
    block position 0, the anchor's own token). Each [b, A, B]."""
    b, a = anchors.shape
    t = tokens.shape[1]
    positions = (anchors[:, :, None] + torch.arange(block_size)).reshape(b, a * block_size)
    label_pos = positions.clamp(max=t - 1)
    labels = tokens.gather(1, label_pos).view(b, a, block_size)
    has_label = (valid.gather(1, label_pos) & (positions < t)).view(b, a, block_size)
    has_label[:, :, 0] = False
    return label_pos.view(b, a, block_size), labels, has_label


def block_losses(
    model: BlockDrafter,
    embed,
    lm_head,
    features: Tensor,
    tokens: Tensor,
    valid: Tensor,
    anchors: Tensor,
    block_size: int,
    gamma: float,
    soft_ids: Tensor | None = None,
    soft_probs: Tensor | None = None,
) -> tuple[Tensor, list[float], list[int]]:
    """Weighted loss, top-1 accuracy per block position 1 .. B - 1, and label counts per position.

    features [b, T, F] (target features at each position), tokens [b, T], valid [b, T] (positions whose
    token is a label), anchors [b, A]. embed: ids -> [.., H] (the target's, frozen); lm_head: [.., H] -> logits.
    soft_ids / soft_probs [b, T, K]: the target's top-K next-token distribution at each position; with them
    the loss at a label is the cross-entropy against the target's distribution at the position before it
    (renormalised over its top K) instead of against the token alone: more signal per label, the same argmax.
    """
    b, a = anchors.shape
    offsets = torch.arange(block_size)
    label_pos, labels, has_label = _block_labels(tokens, valid, anchors, block_size)
    hidden = block_hidden(model, embed, features, tokens, anchors, block_size)

    weights = torch.exp(-(offsets.float() - 1) / gamma)
    total, norm = hidden.new_zeros(()), 0.0
    accuracies, counts = [], []
    for k in range(1, block_size):
        rows = has_label[:, :, k]
        count = int(rows.sum())
        counts.append(count)
        if count == 0:
            accuracies.append(float("nan"))
            continue
        logits = lm_head(hidden[:, :, k][rows]).float()  # [count, V]
        target = labels[:, :, k][rows]
        if soft_ids is None:
            loss_k = F.cross_entropy(logits, target, reduction="sum")
        else:
            before = (label_pos[:, :, k] - 1)[rows]  # [count] position predicting the label
            row_of = torch.arange(b)[:, None].expand(b, a)[rows]
            ids_k = soft_ids[row_of, before].long()  # [count, K]
            probs = soft_probs[row_of, before].float()
            probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
            loss_k = -(probs * torch.log_softmax(logits, dim=-1).gather(-1, ids_k)).sum()
        total = total + float(weights[k]) * loss_k
        norm += float(weights[k]) * count
        accuracies.append(float((logits.argmax(-1) == target).float().mean()))
    return total / max(norm, 1.0), accuracies, counts


def block_accepted(
    model: BlockDrafter,
    embed,
    lm_head,
    features: Tensor,
    tokens: Tensor,
    valid: Tensor,
    anchors: Tensor,
    block_size: int,
) -> Tensor:
    """[b, A] draft tokens a chain verification would accept at each anchor when the text is the target's
    own greedy output: the number of leading block positions whose argmax equals the text's token (a
    position without a label ends the count). 1 + its mean is the chain's tau on that text."""
    _, labels, has_label = _block_labels(tokens, valid, anchors, block_size)
    hidden = block_hidden(model, embed, features, tokens, anchors, block_size)[:, :, 1:]
    right = (lm_head(hidden).argmax(-1) == labels[:, :, 1:]) & has_label[:, :, 1:]  # [b, A, B - 1]
    return right.long().cumprod(-1).sum(-1)


def expected_accepted(accuracies: list[float]) -> float:
    """Tokens a block's chain would add per step if each position were right with its (conditional)
    accuracy independently: sum over k of prod_{j <= k} acc_j, plus the bonus token. A rough guide only:
    the accuracies are unconditional."""
    total, run = 1.0, 1.0
    for acc in accuracies:
        if math.isnan(acc):
            break
        run *= acc
        total += run
    return total


def grown_state(saved: dict[str, Tensor], model: BlockDrafter) -> dict[str, Tensor]:
    """A state dict for `model` from an earlier drafter's `saved` weights with fewer layers: the earlier
    layers keep their weights and each added layer (appended after them) starts as the identity, its
    residual branches closed by zero output projections (o_proj, down_proj) while its other weights keep
    `model`'s initialisation. The grown drafter therefore starts from the earlier one's predictions and
    the fit opens the new layer gradually (the zero projections still receive gradients)."""
    state = model.state_dict()
    layer_keys = [k for k in saved if k.startswith("layers.")]
    earlier = 1 + max((int(k.split(".")[1]) for k in layer_keys), default=-1)
    if earlier > len(model.layers):
        raise ValueError(f"the saved drafter has {earlier} layers; expected at most {len(model.layers)} to grow from")
    unknown = sorted(set(saved) - set(state))
    if unknown:
        raise ValueError(f"the saved drafter has keys this drafter lacks: {unknown[:3]}")
    grown = {k: v.clone() for k, v in state.items()}
    for k, v in saved.items():
        if grown[k].shape != v.shape:
            raise ValueError(f"{k}: saved shape {tuple(v.shape)}, expected {tuple(grown[k].shape)}")
        grown[k] = v.clone()
    for i in range(earlier, len(model.layers)):
        for out in (f"layers.{i}.self_attn.o_proj", f"layers.{i}.mlp.down_proj"):
            for k in (f"{out}.weight", f"{out}.bias"):
                if k in grown:
                    grown[k].zero_()
    return grown
