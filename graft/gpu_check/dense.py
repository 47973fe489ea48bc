"""Part 4 of the device check: a LLaMA-3.1-8B-shaped target with an EAGLE-3-shaped head: decode time against
its HBM bound, verify(N) / decode per tree size and context, short ar / eagle3 / graft decode loops greedy and
at temperature 1 (whole steps over AR's, on the events clock), and the head's extend peak memory."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from graft.gpu_check.measure import (
    Clock,
    decode_record,
    gib,
    hardware_config,
    harness_target,
    hbm_bound,
    method_config_of,
    parameter_count,
    random_causal_lm,
    random_ids,
    ratio,
    rounded,
    sync,
    timed_verify,
    verify_times,
)
from graft.gpu_check.plan import RANDOM_NOTE, Plan
from graft.gpu_check.report import Context, release_memory


def dense_layers(plan: Plan, device: torch.device, remaining_s: float) -> tuple[int, str | None]:
    """How many layers part 4 builds: all of them, unless the time left or the free memory is short."""
    layers = plan.dense_arch["num_hidden_layers"]
    if remaining_s < plan.dense_full_needs_s:
        return (
            plan.dense_fallback_layers,
            f"{remaining_s:.0f} s of the part's budget left (< {plan.dense_full_needs_s:.0f} s)",
        )
    if device.type == "cuda":
        a = plan.dense_arch
        per_layer = 2 * (
            4 * a["hidden_size"] ** 2 + 3 * a["hidden_size"] * a["intermediate_size"]
        )  # bf16 bytes, upper bound
        free, _ = torch.cuda.mem_get_info(device)
        fits = int((free - 12 * 2**30) // per_layer)  # 12 GiB for embeddings, head, caches and activations
        if fits < layers:
            return max(1, min(fits, plan.dense_fallback_layers)), f"{gib(free)} GiB free fits {fits} layers"
    return layers, None


def save_random_head(target, plan: Plan, directory: Path) -> dict:
    """A random EAGLE-3 head shaped for `target` (graft.draft_models.eagle.checkpoint.random_head, draft vocabulary
    plan.draft_vocab), saved in SpecForge's layout, so methods load it as `method.head=<directory>`."""
    from graft.draft_models.eagle.checkpoint import random_head, save_head

    head = random_head(target, "eagle3", draft_vocab=plan.draft_vocab)
    save_head(head, directory, layout="specforge")
    info = {"parameters_m": round(parameter_count(head) / 1e6, 1), "layer_ids": head.cfg.layer_ids}
    del head
    return info


def drafter_overrides(name: str, head_dir: Path) -> list[str]:
    """dflash drafts with a seeded random block drafter shaped for the target (method.checkpoint=random, as the
    other random-weight checks build it: tests/conftest.py make_drafter); the others with the saved EAGLE-3 head."""
    return ["method.checkpoint=random"] if name == "dflash" else [f"method.head={head_dir}"]


def decode_loops(ctx: Context, target, head_dir: Path, out: dict) -> dict:
    """Short loops of plan.decode_methods on a random prompt of plan.decode_context tokens, greedy and at
    temperature 1, timed as runs time them on this device (hardware.timing=auto: CUDA events at the phase
    boundaries, no synchronise per phase); the verify forwards are timed inside the loop, the rest of each
    step is the harness's overhead."""
    from baselines.autoregressive import Autoregressive
    from graft.decode import SamplingConfig, generate
    from graft.registry import build_drafter

    plan = ctx.plan
    drafters = {m: Autoregressive(target) if m == "ar" else None for m in plan.decode_methods}
    for name in drafters:
        if drafters[name] is None:
            drafters[name] = build_drafter(method_config_of(name, drafter_overrides(name, head_dir)), target)
    prompt = random_ids(plan.decode_context, target.vocab_size, seed=1)
    decode = out["decode"] = {
        "note": RANDOM_NOTE,
        "prompt_tokens": len(prompt),
        "max_new_tokens": plan.decode_tokens,
        "clock": target.timing,
        "fixed_size_trees": target.fixed_size_trees,
    }
    for temperature in (0.0, 1.0):
        rows = decode[f"temperature_{temperature:g}"] = {}
        for name, drafter in drafters.items():
            if ctx.time_left() <= 0:
                decode["truncated"] = f"budget spent before {name} (temperature {temperature:g})"
                return drafters
            sampling = SamplingConfig(temperature=temperature)

            def run(tokens, name=name, drafter=drafter, sampling=sampling):
                generator = torch.Generator().manual_seed(0)
                return generate(target, drafter, prompt, tokens, set(), sampling, generator)

            run(min(8, plan.decode_tokens))  # warm-up, untimed
            with timed_verify(target) as verify_ms:
                gen = run(plan.decode_tokens)
            rows[name] = decode_record(gen, verify_ms)
            ctx.checkpoint()
    return drafters


def step_ratios(decode: dict) -> dict:
    """Each method's whole step over AR's (greedy), and its step at temperature 1 over its greedy one."""
    greedy, sampled = decode.get("temperature_0", {}), decode.get("temperature_1", {})
    ar = greedy.get("ar", {}).get("step_ms")
    out = {}
    for name in greedy:
        if name != "ar":
            out[f"{name}_step_over_decode"] = ratio(greedy[name].get("step_ms"), ar)
        out[f"{name}_t1_over_greedy"] = ratio(sampled.get(name, {}).get("step_ms"), greedy[name].get("step_ms"))
    return out


def verify_ratios(verify: dict, bound_ms: float | None) -> dict:
    """verify(N) / decode (= verify(1)) per context, the HBM bound over decode at the first context, and the
    goal's verify(60) / decode at 1K and 8K context."""
    over = {
        c: {n: ratio(r["median_ms"], rows["1"]["median_ms"]) for n, r in rows.items()} for c, rows in verify.items()
    }
    first = next(iter(verify.values()), {})
    out = {"verify_over_decode": over, "ar_over_bound_eager": ratio(bound_ms, first.get("1", {}).get("median_ms"))}
    for label, context in (("1k", "1024"), ("8k", "8192")):
        out[f"verify60_over_decode_{label}"] = over.get(context, {}).get("60")
    if bound_ms is None:
        out["ar_over_bound_eager_note"] = "no HBM bound on this device"
    return out


def prune_verify(target, plan: Plan) -> dict:
    """verify(N) at pruning's kept sizes (plan.prune_nodes) on plan.decode_context tokens, through the helper
    the verify(60) / decode goals use."""
    context = random_ids(plan.decode_context, target.vocab_size, seed=3)
    return verify_times(target, context, tuple(sorted(plan.prune_nodes, reverse=True)), plan)


def prune_ratios(rows: dict) -> dict:
    """verify(16) / verify(60), and the worst verify(smaller) / verify(larger) over consecutive kept sizes: the
    goals (goals.py) ask the verify cost to fall with the nodes pruning keeps, a step up of 5 % taken for noise."""
    ms = {int(n): r["median_ms"] for n, r in rows.items()}
    sizes = sorted(ms, reverse=True)
    steps = [ratio(ms[small], ms[large]) for large, small in zip(sizes, sizes[1:])]
    steps = [s for s in steps if s is not None]
    return {
        "prune_verify16_over_verify60": ratio(ms.get(16), ms.get(60)),
        "prune_verify_step_max": max(steps) if steps else None,
        "prune_verify_over_60": {str(n): ratio(ms[n], ms.get(60)) for n in sizes},
    }


def extend_peak(ctx: Context, target, drafter) -> dict:
    """The head's extend over a plan.extend_tokens-token prompt (what a drafter's reset does after the
    prefill): its time and the memory it needs beyond what was allocated before (torch.cuda peak)."""
    from graft.drafter import PrefillInfo, SequenceState

    ids = random_ids(ctx.plan.extend_tokens, target.vocab_size, seed=2)
    target.reset(len(ids) + 16)
    release_memory()
    clock, cuda = Clock(target.device), target.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(target.device)
    before = torch.cuda.memory_allocated(target.device) if cuda else 0
    start = clock.mark()
    forward = target.prefill(ids, drafter.needs.taps)
    middle = clock.mark()
    prefill_peak = torch.cuda.max_memory_allocated(target.device) - before if cuda else None
    if cuda:
        sync(target.device)
        torch.cuda.reset_peak_memory_stats(target.device)
    held = torch.cuda.memory_allocated(target.device) if cuda else 0
    first = int(forward.logits[-1].argmax())
    drafter.reset(PrefillInfo(state=SequenceState(tokens=[*ids, first], prompt_len=len(ids)), forward=forward))
    end = clock.mark()
    sync(target.device)
    return {
        "prompt_tokens": len(ids),
        "target_prefill_ms": rounded(clock.ms(start, middle)),
        "target_prefill_peak_gib": gib(prefill_peak) if cuda else None,
        "head_extend_ms": rounded(clock.ms(middle, end)),  # includes the argmax's sync: on the CPU, all host time
        "head_extend_peak_gib": gib(torch.cuda.max_memory_allocated(target.device) - held) if cuda else None,
        "note": None if cuda else "peak memory is measured on CUDA only",
    }


def part_llama8b(ctx: Context, out: dict) -> None:
    plan, dtype = ctx.plan, getattr(torch, ctx.plan.dtype)
    layers, why = dense_layers(plan, ctx.device, ctx.time_left())
    arch = {**plan.dense_arch, "num_hidden_layers": layers}
    out.update(arch=arch, dtype=plan.dtype, note=RANDOM_NOTE)
    if why:
        out["reduced_layers"] = f"{layers} of {plan.dense_arch['num_hidden_layers']} layers: {why}"
    start = time.perf_counter()
    model = random_causal_lm("llama", arch, ctx.device, dtype)
    out.update(build_s=round(time.perf_counter() - start, 1), parameters_b=round(parameter_count(model) / 1e9, 3))
    if ctx.cuda:
        out["weights_gib"] = gib(torch.cuda.memory_allocated(ctx.device))
    out["bound"] = hbm_bound(model, ctx.device)
    target = harness_target(model, hardware_config(ctx), "llama8b_shaped")
    out.update(attention=getattr(target, "attention", None), prefill_chunk=getattr(target, "prefill_chunk", None))
    target.max_context = max(plan.extend_tokens, max(plan.dense_contexts)) + max(plan.dense_nodes) + 1024
    out["verify"] = {}
    for context_len in plan.dense_contexts:
        context = random_ids(context_len, target.vocab_size, seed=context_len)
        out["verify"][str(context_len)] = verify_times(target, context, plan.dense_nodes, plan)
        ctx.checkpoint()
    out["ratios"] = verify_ratios(out["verify"], out["bound"]["hbm_bound_ms"])
    out["prune_verify"] = prune_verify(target, plan)
    out["ratios"].update(prune_ratios(out["prune_verify"]))
    ctx.checkpoint()
    with tempfile.TemporaryDirectory(prefix="gpu_check_head_") as tmp:
        out["head"] = save_random_head(target, plan, Path(tmp) / "head")
        ctx.checkpoint()
        drafters = decode_loops(ctx, target, Path(tmp) / "head", out)
    out["ratios"].update(step_ratios(out["decode"]))
    if ctx.time_left() > 0 and "eagle3" in drafters:
        out["extend"] = extend_peak(ctx, target, drafters["eagle3"])
    else:
        out["extend"] = {"skipped": "budget spent"}
