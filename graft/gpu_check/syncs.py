"""Part 3 of the device check: host syncs per decode step of ar, pld, eagle3, pruned and graft with the GPU
settings, greedy and at temperature 1, on a dense and an MoE tiny model: counted at the dispatcher on any
device (graft/gpu_check/sync_counter.py), and on CUDA under torch.cuda.set_sync_debug_mode("warn") plus
explicit synchronizes."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import torch

from graft.gpu_check.measure import builtin_prompt_ids, load_tiny, method_config_of, per_step_rate
from graft.gpu_check.report import Context
from graft.gpu_check.sync_counter import per_step, sites_of, syncs_of

ROOT = Path(__file__).resolve().parents[2]  # sync sites are named relative to the repository


def short_path(filename: str) -> str:
    path = Path(filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


@contextlib.contextmanager
def counting_synchronize(sites: Counter) -> Iterator[None]:
    """Counts explicit torch.cuda.synchronize calls by caller: sync debug mode does not report them, and
    hardware.timing=sync makes one at every phase boundary."""
    original = torch.cuda.synchronize

    def counted(*args, **kwargs):
        caller = sys._getframe(1)
        sites[f"{short_path(caller.f_code.co_filename)}:{caller.f_lineno} (torch.cuda.synchronize)"] += 1
        return original(*args, **kwargs)

    torch.cuda.synchronize = counted
    try:
        yield
    finally:
        torch.cuda.synchronize = original


@contextlib.contextmanager
def debug_mode_sites() -> Iterator[Callable[[], Counter]]:
    """The block under torch.cuda.set_sync_debug_mode("warn"); yields a function that returns the host syncs so
    far by where they were made (file:line of the Python caller): the ones sync debug mode reports, and explicit
    synchronizes. It may be called inside the block (per step) or after it."""
    explicit: Counter = Counter()
    with warnings.catch_warnings(record=True) as caught, counting_synchronize(explicit):
        warnings.simplefilter("always")  # every occurrence, not the first per line

        def so_far() -> Counter:
            reported = Counter(f"{short_path(w.filename)}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
            return reported + explicit

        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield so_far
        finally:
            torch.cuda.set_sync_debug_mode(0)


def count_syncs(run: Callable[[], object]) -> tuple[object, Counter]:
    """Run `run` under torch.cuda.set_sync_debug_mode("warn"), counting the host syncs by where they were
    made (debug_mode_sites)."""
    with debug_mode_sites() as so_far:
        result = run()
    return result, so_far()


def dispatcher_row(generate_once, drafter) -> dict:
    """Syncs per decode step counted at the dispatcher (graft/gpu_check/sync_counter.py): the mean and the worst
    step, the kinds over all steps and the places of the worst step's."""
    steps = per_step(generate_once, drafter)
    counts = [sum(syncs_of(step).values()) for step in steps]
    if not counts:
        return {"steps": 0}
    kinds: Counter = Counter()
    for step in steps:
        kinds.update(syncs_of(step))
    worst = steps[counts.index(max(counts))]
    allowed = allowed_reads(drafter)
    return {
        "steps": len(counts),
        "mean": round(sum(counts) / len(counts), 2),
        "max": max(counts),
        "allowed": allowed,
        "excess_max": max(counts) - allowed,
        "kinds": dict(kinds),
        "worst_step_sites": dict(Counter(sites_of(worst)).most_common(8)),
    }


def allowed_reads(drafter) -> int:
    """The reads a step may make: the accepted path, and for a method that prunes a fixed-size tree to a bucket
    (graft/compose.py: ComposedDrafter.bucket) the size it kept."""
    return 2 if getattr(drafter, "bucket", 0) else 1


def debug_mode_row(target, drafter, ids, ctx: Context, sampling) -> dict:
    """Syncs per step under torch.cuda.set_sync_debug_mode("warn") plus explicit synchronizes (CUDA only): a
    long run's less a short one's, over their step difference, so the prefill's cancel."""
    from graft.decode import generate

    short, long = ctx.plan.sync_tokens

    def once(n):
        return generate(target, drafter, ids, n, set(), sampling, torch.Generator().manual_seed(0))

    (gen_a, sites_a), (gen_b, sites_b) = (count_syncs(lambda n=n: once(n)) for n in (short, long))
    syncs = [sum(sites_a.values()), sum(sites_b.values())]
    rate = per_step_rate((syncs[0], gen_a.steps), (syncs[1], gen_b.steps))
    return {
        "syncs_per_step": rate,
        "excess_per_step": None if rate is None else round(rate - allowed_reads(drafter), 2),
        "steps": [gen_a.steps, gen_b.steps],
        "syncs": syncs,
        "sites_long_run": dict(sites_b.most_common(10)),
    }


def part_host_syncs(ctx: Context, out: dict) -> None:
    """Every method of plan.sync_methods on the tiny models with the GPU settings (fixed-size trees, graft_sdpa,
    the events clock), greedy and at temperature 1: syncs per step at the dispatcher (any device), and on CUDA
    under sync debug mode too."""
    from baselines.autoregressive import Autoregressive
    from graft.decode import SamplingConfig, generate
    from graft.registry import build_drafter

    plan = ctx.plan
    out["note"] = (
        "dispatcher: per step, every ATen op that waits for the device (graft/gpu_check/sync_counter.py), GPU "
        "settings (hardware=gpu: fixed-size trees, graft_sdpa); debug_mode (CUDA only): what "
        "set_sync_debug_mode reports plus explicit synchronizes, a long run's less a short one's per step"
    )
    short, long = plan.sync_tokens
    out["dispatcher"], out["debug_mode"] = {}, {}
    for model_name in plan.sync_models:
        model, _ = load_tiny(model_name, "float32", ctx)
        target = model.target
        # on a CPU, small trees take host paths that read on purpose (graft.ops.Ops.on_host); count the device path
        target.ops.host_paths = False
        ids = builtin_prompt_ids(model, 1)[0]
        for temperature in (0.0, 1.0):
            sampling, key = SamplingConfig(temperature=temperature), f"{model_name} temperature {temperature:g}"
            rows, debug = out["dispatcher"].setdefault(key, {}), {}
            for name in plan.sync_methods:
                if ctx.time_left() <= 0:
                    out["truncated"] = f"budget spent before {name} ({key})"
                    out["ratios"] = sync_ratios(out)
                    return
                drafter = Autoregressive(target) if name == "ar" else build_drafter(method_config_of(name), target)

                def once(drafter=drafter, sampling=sampling, target=target, ids=ids):
                    generator = torch.Generator().manual_seed(0)
                    return generate(target, drafter, ids, long, set(), sampling, generator)

                once()  # warm-up: lazy initialisation reads once
                rows[name] = dispatcher_row(once, drafter)
                if ctx.cuda:
                    debug[name] = debug_mode_row(target, drafter, ids, ctx, sampling)
                ctx.checkpoint()
            if debug:
                out["debug_mode"][key] = debug
    out["ratios"] = sync_ratios(out)


def sync_ratios(out: dict) -> dict:
    """The worst step of the worst method, greedy and sampled, and the worst debug-mode rate."""

    def worst(tables: dict, sampled: bool, field: str):
        values = [
            row.get(field)
            for key, rows in tables.items()
            if key.endswith("temperature 1") == sampled
            for row in rows.values()
            if row.get(field) is not None
        ]
        return max(values) if values else None

    ratios = {
        "syncs_per_step_max": worst(out["dispatcher"], False, "max"),
        "syncs_per_step_sampled_max": worst(out["dispatcher"], True, "max"),
        "excess_syncs_max": worst(out["dispatcher"], False, "excess_max"),
        "excess_syncs_sampled_max": worst(out["dispatcher"], True, "excess_max"),
        "debug_mode_syncs_per_step_max": worst(out["debug_mode"], False, "syncs_per_step"),
        "debug_mode_excess_max": worst(out["debug_mode"], False, "excess_per_step"),
    }
    if not out["debug_mode"]:
        ratios["debug_mode_syncs_per_step_max_note"] = "sync debug mode needs CUDA"
        ratios["debug_mode_excess_max_note"] = "sync debug mode needs CUDA"
    return ratios
