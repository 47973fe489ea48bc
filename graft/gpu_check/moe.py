"""Parts 5 and 6 of the device check: a few Qwen3-235B-A22B-shaped MoE layers (verify time and experts
touched per tree size), and a 235B-shaped SpecForge EAGLE-3 head checkpoint (head_dim 128 != hidden /
heads) that loads and runs."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from graft.gpu_check.measure import (
    gib,
    hardware_config,
    harness_target,
    parameter_count,
    random_causal_lm,
    random_ids,
    ratio,
    rounded,
    verify_times,
)
from graft.gpu_check.plan import RANDOM_NOTE
from graft.gpu_check.report import Context


def part_moe_layers(ctx: Context, out: dict) -> None:
    from graft.budget.experts import ExpertsTouched

    plan, arch = ctx.plan, ctx.plan.moe_arch
    out.update(arch=arch, dtype=plan.dtype, context=plan.moe_context, note=RANDOM_NOTE)
    start = time.perf_counter()
    model = random_causal_lm("qwen3_moe", arch, ctx.device, getattr(torch, plan.dtype))
    out.update(build_s=round(time.perf_counter() - start, 1), parameters_b=round(parameter_count(model) / 1e9, 3))
    out["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    if ctx.cuda:
        out["weights_gib"] = gib(torch.cuda.memory_allocated(ctx.device))
    target = harness_target(model, hardware_config(ctx), "qwen3_235b_layers")
    out["attention"] = getattr(target, "attention", None)
    touched = ExpertsTouched(model)
    experts: dict[str, float] = {}

    def count_experts(n, tree, topo) -> None:
        touched.take()
        target.verify(tree, topo)
        experts[str(n)] = rounded(touched.mean_per_layer(), 1)

    context = random_ids(plan.moe_context, target.vocab_size, seed=3)
    try:
        out["verify"] = verify_times(target, context, plan.moe_nodes, plan, on_tree=count_experts)
    finally:
        touched.remove()
    for n, row in out["verify"].items():
        row["experts_touched_per_layer"] = experts.get(n)
    out["experts_per_layer"] = arch["num_experts"]
    out["ratios"] = moe_ratios(out["verify"], arch)


def moe_ratios(verify: dict, arch: dict) -> dict:
    """verify(N) / decode per tree size beside the bytes bound's (graft/costmodel/bound.py: the same layers
    reading the experts this verify touched, over a decode step's top_k), and the goal table's N = 60."""
    from graft.costmodel.bound import moe_step_bytes

    decode_ms = verify["1"]["median_ms"]
    decode_bytes = moe_step_bytes(arch, arch["num_experts_per_tok"])
    measured, bound = {}, {}
    for n, row in verify.items():
        measured[n] = ratio(row["median_ms"], decode_ms)
        touched = row.get("experts_touched_per_layer")
        bound[n] = ratio(moe_step_bytes(arch, touched), decode_bytes) if touched is not None else None
    out = {"verify_over_decode": measured, "bytes_over_decode_bytes": bound}
    out["verify60_over_decode"] = measured.get("60")
    if bound.get("60") is not None:
        experts = verify["60"].get("experts_touched_per_layer")
        out["verify60_over_decode_note"] = f"{experts} experts/layer touched; bytes bound {bound['60']}x"
    return out


# --- part 6: a 235B-shaped SpecForge EAGLE-3 head loads --------------------------------------------------


def specforge_head_state(raw: dict, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Random weights named and shaped as a SpecForge EAGLE-3 checkpoint of config `raw`, derived from the
    config alone (not from graft's head, so a shape bug there cannot hide behind its own checkpoint)."""
    h, d, i = raw["hidden_size"], raw["head_dim"], raw["intermediate_size"]
    q, kv, feats = raw["num_attention_heads"] * d, raw["num_key_value_heads"] * d, 3 * raw["target_hidden_size"]
    shapes = {
        "fc.weight": (h, feats),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "lm_head.weight": (raw["draft_vocab_size"], h),
    }
    state = {k: torch.empty(s, dtype=dtype, device=device).normal_(0, 0.02).cpu() for k, s in shapes.items()}
    for norm in ("midlayer.hidden_norm", "midlayer.input_layernorm", "midlayer.post_attention_layernorm", "norm"):
        state[f"{norm}.weight"] = torch.ones(h, dtype=dtype)
    draft = raw["draft_vocab_size"]
    state["d2t"] = torch.arange(draft, dtype=torch.long)  # draft id i -> target id 2i
    t2d = torch.zeros(raw["vocab_size"], dtype=torch.bool)
    t2d[2 * torch.arange(draft)] = True
    state["t2d"] = t2d
    return state


@dataclass
class TargetStub:
    """What load_head reads of a target: its config, LM head, device and dtype (no 235B weights needed)."""

    config: object
    device: torch.device
    dtype: torch.dtype
    lm_head: object = None


def part_head235(ctx: Context, out: dict) -> None:
    from safetensors.torch import save_file
    from transformers import Qwen3MoeConfig

    from graft.draft_models.eagle.checkpoint import load_head
    from graft.methods.eagle_tree import extend

    raw, dtype = ctx.plan.head235, getattr(torch, ctx.plan.dtype)
    target = TargetStub(Qwen3MoeConfig(**ctx.plan.target235), ctx.device, dtype)
    expected_layers = [i + 1 for i in raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    out.update(
        config={
            k: raw[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "draft_vocab_size",
            )
        },
        hidden_over_heads=raw["hidden_size"] // raw["num_attention_heads"],
    )
    with tempfile.TemporaryDirectory(prefix="gpu_check_head235_") as tmp:
        start = time.perf_counter()
        state = specforge_head_state(raw, dtype, ctx.device)
        out["parameters_m"] = round(sum(t.numel() for t in state.values() if t.is_floating_point()) / 1e6, 1)
        (Path(tmp) / "config.json").write_text(json.dumps(raw, indent=2))
        save_file(state, str(Path(tmp) / "model.safetensors"))
        del state
        out["write_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        try:
            head = load_head(tmp, target)
        except Exception as err:  # the finding itself: keep the loader's message in the result as well
            out["load_error"] = f"{type(err).__name__}: {err}"[:2000]
            raise
        out["load_s"] = round(time.perf_counter() - start, 1)
    cfg = head.cfg
    out.update(head_dim=cfg.head_dim, layer_ids=cfg.layer_ids, expected_layer_ids=expected_layers, kind=cfg.kind)
    assert cfg.head_dim == raw["head_dim"], f"loaded head_dim {cfg.head_dim}, config says {raw['head_dim']}"
    assert cfg.layer_ids == expected_layers, f"layer ids {cfg.layer_ids}, SpecForge's aux ids + 1 are {expected_layers}"
    # one extend over a few positions: the loaded head runs with the target's feature width and vocabulary
    n, h = 4, raw["hidden_size"]
    embeds = torch.randn(n, h, device=ctx.device, dtype=dtype)
    features = torch.randn(n, 3 * raw["target_hidden_size"], device=ctx.device, dtype=dtype)
    with torch.inference_mode():
        hidden = extend(head, head.new_cache(16), embeds, features)
        logp, d2t = head.log_probs(hidden)
    out.update(extend_out=list(hidden.shape), log_probs=list(logp.shape), uses_d2t=d2t is not None)
    assert list(logp.shape) == [n, raw["draft_vocab_size"]], f"log_probs {list(logp.shape)}"
