"""Part 3 of the device check: host syncs per decode step of ar, eagle3, pruned and graft, with and without
fixed-size trees (torch.cuda.set_sync_debug_mode("warn"), plus explicit synchronizes; CUDA only)."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import torch

from graft.gpu_check.measure import builtin_prompt_ids, load_tiny, method_config_of, per_step_rate
from graft.gpu_check.report import Context, SkipPart

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


def count_syncs(run: Callable[[], object]) -> tuple[object, Counter]:
    """Run `run` under torch.cuda.set_sync_debug_mode("warn"), counting the host syncs by where they were
    made (file:line of the Python caller): the ones sync debug mode reports, and explicit synchronizes."""
    sites: Counter = Counter()
    with warnings.catch_warnings(record=True) as caught, counting_synchronize(sites):
        warnings.simplefilter("always")  # every occurrence, not the first per line
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    sites.update(f"{short_path(w.filename)}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return result, sites


def part_host_syncs(ctx: Context, out: dict) -> None:
    if not ctx.cuda:
        raise SkipPart("needs CUDA: torch.cuda.set_sync_debug_mode reports device synchronisations only")
    from baselines.autoregressive import Autoregressive
    from graft.decode import generate
    from graft.registry import build_drafter

    out["note"] = (
        "syncs per step = (syncs of a long run - a short run's) / (their step difference): the prefill's cancel; "
        "syncs = what sync debug mode reports plus explicit torch.cuda.synchronize calls (hardware.timing=sync)"
    )
    short, long = ctx.plan.sync_tokens
    # the host path (trees trimmed to what the draft kept) and fixed-size trees (hardware.static_trees,
    # the GPU default), whose every method should sync once per step
    for timing, static in (("async", True), ("async", False), ("sync", True)):
        overrides = [f"hardware.timing={timing}", f"hardware.static_trees={str(static).lower()}"]
        model, _ = load_tiny("tiny_llama", "float32", ctx, overrides)
        target = model.target
        ids = builtin_prompt_ids(model, 1)[0]
        drafters = {"ar": Autoregressive(target)}
        drafters.update({m: build_drafter(method_config_of(m), target) for m in ("eagle3", "pruned", "graft")})
        rows = out[f"timing_{timing}" + ("_static_trees" if static else "")] = {}
        for name, drafter in drafters.items():
            generate(target, drafter, ids, short, set())  # warm-up: lazy CUDA initialisation syncs once
            (gen_a, sites_a), (gen_b, sites_b) = (
                count_syncs(lambda n=n: generate(target, drafter, ids, n, set())) for n in (short, long)
            )
            syncs = [sum(sites_a.values()), sum(sites_b.values())]
            rows[name] = {
                "syncs_per_step": per_step_rate((syncs[0], gen_a.steps), (syncs[1], gen_b.steps)),
                "steps": [gen_a.steps, gen_b.steps],
                "syncs": syncs,
                "sites_long_run": dict(sites_b.most_common(10)),
            }
            ctx.checkpoint()
