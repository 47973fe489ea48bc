"""Part 2 of the device check: every configs/method/*.yaml against the autoregressive baseline on the tiny
random models, in float32 and bfloat16 (graft/runner.compare decides, with float ties)."""

from __future__ import annotations

import time

from graft.gpu_check.measure import as_conversation, builtin_prompt_ids, load_tiny, method_config_of
from graft.gpu_check.plan import Plan
from graft.gpu_check.report import Context, release_memory, traceback_tail


def part_lossless(ctx: Context, out: dict) -> None:
    """Greedy tokens of every method equal the baseline's (graft/runner.compare decides, with float ties)."""
    from graft.config import group_options

    plan = ctx.plan
    methods = list(plan.lossless_methods or group_options("method"))
    configs = {m: method_config_of(m) for m in methods}  # every tiny model's draft_head is `random`: compose once
    out.update(methods=methods, prompts=plan.lossless_prompts, max_new_tokens=plan.lossless_tokens, models={})
    started = time.perf_counter()
    pending = [(m, d) for m in plan.lossless_models for d in plan.lossless_dtypes]
    while pending:
        if ctx.time_left() <= 0:
            out["truncated"] = f"budget spent after {time.perf_counter() - started:.0f} s; not checked: {pending}"
            break
        model_name, dtype = pending.pop(0)
        out["models"].setdefault(model_name, {})[dtype] = lossless_rows(model_name, dtype, configs, ctx)
        release_memory()
        ctx.checkpoint()
    out["totals"] = lossless_totals(out["models"])


def lossless_rows(model_name: str, dtype: str, configs: dict, ctx: Context) -> dict:
    """{method: equal / checked / divergences / error} for one tiny model in one dtype."""
    from graft.registry import build_drafter

    plan = ctx.plan
    model, cfg = load_tiny(model_name, dtype, ctx)
    target, rows = model.target, {}
    prompts = builtin_prompt_ids(model, plan.lossless_prompts)
    bases = baseline_generations(model, prompts, plan)
    for method, method_cfg in configs.items():
        rows[method] = lossless_row(
            model, cfg, lambda method_cfg=method_cfg: build_drafter(method_cfg, target), prompts, bases, plan
        )
    return rows


def baseline_generations(model, prompts: list[list[int]], plan: Plan) -> list:
    """The autoregressive baseline's greedy generation of each prompt, with the top-2 gaps for the tie rule."""
    from baselines.autoregressive import Autoregressive
    from graft.decode import generate

    target = model.target
    return [
        generate(target, Autoregressive(target), ids, plan.lossless_tokens, model.stop_ids, record_gaps=True)
        for ids in prompts
    ]


def lossless_row(model, cfg, make_drafter, prompts: list[list[int]], bases: list, plan: Plan) -> dict:
    """Equal / checked / divergences / error of one method on `model`'s target against the baseline
    generations `bases` of `prompts`; seconds per prompt (a compiled target's first one compiles)."""
    from graft.decode import generate
    from graft.runner import compare

    target = model.target
    row = {"equal": 0, "checked": 0, "divergent": [], "seconds": []}
    try:
        drafter = make_drafter()
        for k, (ids, base) in enumerate(zip(prompts, bases)):
            started = time.perf_counter()
            gen = generate(target, drafter, ids, plan.lossless_tokens, model.stop_ids)
            row["seconds"].append(round(time.perf_counter() - started, 2))
            verdict = compare(as_conversation(gen), as_conversation(base), target.dtype, cfg.run.float_tie_ulps)
            row["checked"] += 1
            row["equal"] += verdict["equal"]
            if not verdict["equal"]:
                row["divergent"].append({"prompt": k, **verdict["first_divergence"]})
    except Exception as err:  # one method's failure (a GPU-path bug) must not hide the others' results
        row["error"] = f"{type(err).__name__}: {err}"[:1000]
        row["traceback"] = traceback_tail(err, 6)
    return row


def lossless_totals(models: dict) -> dict:
    """Counts over every (model, dtype, method): lossless means every divergence is a float tie and nothing failed."""
    rows = [row for dtypes in models.values() for methods in dtypes.values() for row in methods.values()]
    divergent = [d for row in rows for d in row["divergent"]]
    ties = sum(bool(d["float_tie"]) for d in divergent)
    failed = [row["error"] for row in rows if "error" in row]
    return {
        "checks": sum(row["checked"] for row in rows),
        "equal": sum(row["equal"] for row in rows),
        "float_tie_divergences": ties,
        "other_divergences": len(divergent) - ties,
        "errors": len(failed),
        "lossless": len(divergent) == ties and not failed,
    }
