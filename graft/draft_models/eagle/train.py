"""Training an EAGLE-3 head for a target of this harness: data the target writes itself, fused features,
a draft vocabulary from token frequencies, and the training-time test (TTT) over unrolled steps.

Training-time test: at unrolled step j the head, anchored at position t, reads the token t + j + 1 and
its own step j - 1 output (step 0 reads the fused target features), sits at position t + j, attends to
the step-0 keys at positions <= t and to its own earlier steps at the same anchor (exactly what a
draft chain sees at inference), and predicts token t + j + 2. Step j's loss is weighted by w^j.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graft.draft_models.eagle.head import DraftHead


def draft_vocabulary(counts: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """The `size` most frequent target ids, sorted; returns (d2t, t2d) in the published format:
    target id = draft id + d2t[draft id]; t2d[target id] says whether it is in the draft vocabulary."""
    ids = torch.sort(torch.topk(counts.float(), size).indices).values
    d2t = ids - torch.arange(size)
    t2d = torch.zeros(counts.shape[0], dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def ttt_losses(
    head: DraftHead,
    embed,
    features: Tensor,
    tokens: Tensor,
    valid: Tensor,
    steps: int,
    soft_ids: Tensor | None = None,
    soft_probs: Tensor | None = None,
) -> tuple[list[Tensor], list[float]]:
    """Per-step losses and accuracies for a right-padded batch.

    features [B, T, 3H] (target taps at each position), tokens [B, T], valid [B, T] (positions whose
    token is a training label: the target's own answer tokens). Labels are the next tokens themselves:
    the data was generated greedily by the target, so they are its argmax. With soft_ids / soft_probs
    [B, T, K] (the target's top-K next-token ids and probabilities at each position) the loss is the
    cross-entropy against that distribution, restricted to the draft vocabulary and renormalised: it
    also teaches the ranks below the first, which a top-k tree verifies. Accuracy stays top-1.
    """
    cfg = head.cfg
    layer, attn = head.midlayer, head.midlayer.self_attn
    b, t, _ = features.shape
    h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    groups = h // kvh
    draft_of = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    draft_of[torch.arange(cfg.draft_vocab_size) + head.d2t.cpu()] = torch.arange(cfg.draft_vocab_size)
    base_pos = torch.arange(t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    hidden = head.fc(features)  # [B, T, H]
    keys, values, losses, accuracies = [], [], [], []
    for step in range(steps):
        shift = step + 1
        ids = F.pad(tokens[:, shift:], (0, shift))  # token t + j + 1 at anchor t
        x = torch.cat([layer.input_layernorm(embed(ids)), layer.hidden_norm(hidden)], dim=-1)
        positions = base_pos + step
        q = attn._rope(attn.q_proj(x).view(b, t, h, d).transpose(1, 2), positions)
        k = attn._rope(attn.k_proj(x).view(b, t, kvh, d).transpose(1, 2), positions)
        v = attn.v_proj(x).view(b, t, kvh, d).transpose(1, 2)
        keys.append(k.repeat_interleave(groups, dim=1))
        values.append(v.repeat_interleave(groups, dim=1))
        scores = (q @ keys[0].transpose(2, 3)) / math.sqrt(d)  # [B, h, T, T]
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        own = [(q * keys[i]).sum(-1, keepdim=True) / math.sqrt(d) for i in range(1, len(keys))]  # [B, h, T, 1] each
        weights = torch.softmax(torch.cat([scores, *own], dim=-1).float(), dim=-1).to(q.dtype)
        out = weights[..., :t] @ values[0]
        for i in range(1, len(keys)):
            out = out + weights[..., t + i - 1 : t + i] * values[i]
        out = attn.o_proj(out.transpose(1, 2).reshape(b, t, h * d))
        hidden = hidden + out
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))

        label_pos = shift + 1  # token t + j + 2
        labels = F.pad(tokens[:, label_pos:], (0, label_pos), value=0)
        label_ok = F.pad(valid[:, label_pos:], (0, label_pos), value=False)
        draft_labels = draft_of[labels]
        mask = label_ok & (draft_labels >= 0)
        if mask.any():  # the LM head dominates the cost: score only positions that have a label
            logits = head.lm_head(head.norm(hidden[mask])).float()  # [N, V_draft]
            if soft_ids is None:
                loss = F.cross_entropy(logits, draft_labels[mask])
            else:  # the target's distribution at the position before the label predicts the label
                ids_k = F.pad(soft_ids[:, label_pos - 1 :], (0, 0, 0, label_pos - 1))[mask]  # [N, K]
                probs = F.pad(soft_probs[:, label_pos - 1 :].float(), (0, 0, 0, label_pos - 1))[mask]  # [N, K]
                draft_k = draft_of[ids_k]
                probs = probs * (draft_k >= 0)
                probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
                log_q = torch.log_softmax(logits, dim=-1).gather(-1, draft_k.clamp_min(0))
                loss = -(probs * log_q).sum(-1).mean()
            accuracies.append(float((logits.argmax(-1) == draft_labels[mask]).float().mean()))
        else:
            loss = hidden.sum() * 0.0
            accuracies.append(float("nan"))
        losses.append(loss)
    return losses, accuracies
