"""Part 7 of the device check: hardware.compile (torch.compile over static caches; CUDA graphs with
reduce-overhead): ar, eagle3 and graft against the eager baseline on tiny_llama, and an 8B-shaped slice's
verify time, eager against compiled."""

from __future__ import annotations

import torch

from graft.gpu_check.lossless import baseline_generations, lossless_row, lossless_totals
from graft.gpu_check.measure import (
    builtin_prompt_ids,
    hardware_config,
    harness_target,
    load_tiny,
    method_config_of,
    random_causal_lm,
    random_ids,
    rounded,
    verify_times,
)
from graft.gpu_check.report import Context, release_memory


def part_compiled(ctx: Context, out: dict) -> None:
    """The compiled path against eager: tokens on tiny_llama, then verify time on an 8B-shaped slice."""
    from baselines.autoregressive import Autoregressive
    from graft.registry import build_drafter

    plan = ctx.plan
    overrides = [f"hardware.compile={plan.compile_mode}", f"hardware.compile_backend={plan.compile_backend}"]
    out.update(mode=plan.compile_mode, backend=plan.compile_backend, dtype=plan.dtype, methods={})
    eager, _ = load_tiny("tiny_llama", plan.dtype, ctx)
    prompts = builtin_prompt_ids(eager, plan.lossless_prompts)
    bases = baseline_generations(eager, prompts, plan)
    del eager
    model, cfg = load_tiny("tiny_llama", plan.dtype, ctx, overrides)
    target = model.target
    for k, method in enumerate(plan.compile_methods):
        if ctx.time_left() <= 0:  # a compile cannot be cut short: start none after the budget
            out["truncated"] = f"budget spent; not checked: {list(plan.compile_methods[k:])}"
            break

        def make_drafter(method=method):
            return Autoregressive(target) if method == "ar" else build_drafter(method_config_of(method), target)

        out["methods"][method] = lossless_row(model, cfg, make_drafter, prompts, bases, plan)
        ctx.checkpoint()
    out["totals"] = lossless_totals({"tiny_llama": {plan.dtype: out["methods"]}})
    del model, target
    release_memory()
    arch = {**plan.dense_arch, "num_hidden_layers": plan.compile_layers}
    out["arch"] = arch
    slice_model = random_causal_lm("llama", arch, ctx.device, getattr(torch, plan.dtype))
    hardware = hardware_config(ctx)
    context = random_ids(plan.decode_context, arch["vocab_size"], seed=7)
    out["verify"] = {}
    for name, mode in (("eager", None), ("compiled", plan.compile_mode)):
        if ctx.time_left() <= 0:
            out["verify"]["skipped"] = f"budget spent before the {name} slice"
            return
        target = harness_target(slice_model, hardware, f"llama8b_slice_{name}")
        target.static_trees, target.compile_mode, target.compile_backend = True, mode, plan.compile_backend
        target.max_context = plan.decode_context + max(plan.compile_nodes) + 64
        out["verify"][name] = verify_times(target, context, plan.compile_nodes, plan)
        ctx.checkpoint()
    out["verify"]["eager_over_compiled"] = {
        n: rounded(out["verify"]["eager"][n]["median_ms"] / out["verify"]["compiled"][n]["median_ms"])
        for n in out["verify"]["eager"]
    }
