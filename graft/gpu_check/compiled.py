"""Part 7 of the device check: hardware.compile (torch.compile over static caches; CUDA graphs with
reduce-overhead): ar, eagle3 and graft against the eager baseline on tiny_llama, the graphs compiled and CUDA
graphs recorded once every prompt has run (the timed runs: the goal is none), and an 8B-shaped slice's
decode and verify time, eager against compiled, against its HBM bound."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from graft.gpu_check.lossless import baseline_generations, lossless_row, lossless_totals
from graft.gpu_check.measure import (
    builtin_prompt_ids,
    hardware_config,
    harness_target,
    hbm_bound,
    load_tiny,
    method_config_of,
    random_causal_lm,
    random_ids,
    ratio,
    rounded,
    verify_times,
)
from graft.gpu_check.report import Context, release_memory


@contextlib.contextmanager
def graph_counts() -> Iterator[dict]:
    """Graphs dynamo compiles (graft.backends.compiling.compiled_graphs) and CUDA graphs cudagraph trees record
    (each call of CUDAGraphTreeManager.record_function, a first recording or a re-record) in the block."""
    from graft.backends.compiling import compiled_graphs

    counts, graphs = {"graphs": 0, "recordings": 0}, compiled_graphs()
    try:
        from torch._inductor.cudagraph_trees import CUDAGraphTreeManager
    except ImportError:  # no inductor here: nothing records
        CUDAGraphTreeManager = None
    original = getattr(CUDAGraphTreeManager, "record_function", None)
    if original is not None:

        def record(self, *args, **kwargs):
            counts["recordings"] += 1
            return original(self, *args, **kwargs)

        CUDAGraphTreeManager.record_function = record
    try:
        yield counts
    finally:
        if original is not None:
            CUDAGraphTreeManager.record_function = original
        counts["graphs"] = compiled_graphs() - graphs


def timed_reruns(target, drafters: dict, prompts: list[list[int]], tokens: int, stop_ids) -> dict:
    """Every method again on every prompt, after each has run once (as the runner's warm-up leaves them): what
    compiles or records now would do so inside a timed run."""
    from graft.decode import generate

    with graph_counts() as counts:
        for drafter in drafters.values():
            for ids in prompts:
                generate(target, drafter, ids, tokens, stop_ids)
    return counts


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
    target, drafters = model.target, {}
    for k, method in enumerate(plan.compile_methods):
        if ctx.time_left() <= 0:  # a compile cannot be cut short: start none after the budget
            out["truncated"] = f"budget spent; not checked: {list(plan.compile_methods[k:])}"
            break

        def make_drafter(method=method):
            drafter = Autoregressive(target) if method == "ar" else build_drafter(method_config_of(method), target)
            drafters[method] = drafter
            return drafter

        out["methods"][method] = lossless_row(model, cfg, make_drafter, prompts, bases, plan)
        ctx.checkpoint()
    out["totals"] = lossless_totals({"tiny_llama": {plan.dtype: out["methods"]}})
    out["timed"] = timed_reruns(target, drafters, prompts, plan.lossless_tokens, model.stop_ids)
    out["ratios"] = {"graphs_timed": out["timed"]["graphs"], "rerecords_timed": out["timed"]["recordings"]}
    ctx.checkpoint()
    del model, target
    release_memory()
    arch = {**plan.dense_arch, "num_hidden_layers": plan.compile_layers}
    out["arch"] = arch
    slice_model = random_causal_lm("llama", arch, ctx.device, getattr(torch, plan.dtype))
    hardware = hardware_config(ctx)
    context = random_ids(plan.decode_context, arch["vocab_size"], seed=7)
    out["verify"], out["bound"] = {}, hbm_bound(slice_model, ctx.device)
    for name, mode in (("eager", None), ("compiled", plan.compile_mode)):
        if ctx.time_left() <= 0:
            out["verify"]["skipped"] = f"budget spent before the {name} slice"
            return
        target = harness_target(slice_model, hardware, f"llama8b_slice_{name}")
        target.fixed_size_trees, target.compile_mode, target.compile_backend = True, mode, plan.compile_backend
        target.max_context = plan.decode_context + max(plan.compile_nodes) + 64
        if mode is not None:  # a first pass compiles and records; the timed pass should do neither
            verify_times(target, context, plan.compile_nodes, plan)
            with graph_counts() as counts:
                out["verify"][name] = verify_times(target, context, plan.compile_nodes, plan)
            out["verify"]["timed_counts"] = counts
            out["ratios"]["graphs_timed"] += counts["graphs"]
            out["ratios"]["rerecords_timed"] += counts["recordings"]
        else:
            out["verify"][name] = verify_times(target, context, plan.compile_nodes, plan)
        ctx.checkpoint()
    out["verify"]["eager_over_compiled"] = {
        n: rounded(out["verify"]["eager"][n]["median_ms"] / out["verify"]["compiled"][n]["median_ms"])
        for n in out["verify"]["eager"]
    }
    bound_ms = out["bound"]["hbm_bound_ms"]
    out["ratios"]["ar_over_bound_compiled"] = ratio(bound_ms, out["verify"]["compiled"]["1"]["median_ms"])
    out["ratios"]["ar_over_bound_slice_eager"] = ratio(bound_ms, out["verify"]["eager"]["1"]["median_ms"])
    if bound_ms is None:
        out["ratios"]["ar_over_bound_compiled_note"] = "no HBM bound on this device"
    else:
        out["ratios"]["ar_over_bound_compiled_note"] = f"{plan.compile_layers}-layer slice, {plan.compile_mode}"
