"""Part 2 of the device check: every configs/method/*.yaml against the autoregressive baseline on the tiny
random models, in float32 and bfloat16 (graft/run/lossless.py decides, with float ties)."""

from __future__ import annotations

import time

from graft.gpu_check.measure import as_conversation, builtin_prompt_ids, load_tiny, method_config_of
from graft.gpu_check.plan import Plan
from graft.gpu_check.report import Context, release_memory, traceback_tail


def part_lossless(ctx: Context, out: dict) -> None:
    """Greedy tokens of every method equal the baseline's (graft/run/lossless.py decides, with float ties)."""
    from graft.config.hydra_setup import group_options

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
    out["ratios"] = {"lossless": out["totals"]["lossless"] and "truncated" not in out}
    if "truncated" in out:
        out["ratios"]["lossless_note"] = out["truncated"]


def lossless_rows(model_name: str, dtype: str, configs: dict, ctx: Context) -> dict:
    """{method: equal / checked / divergences / error} for one tiny model in one dtype."""
    from graft.registry import build_drafter

    plan = ctx.plan
    model, cfg = load_tiny(model_name, dtype, ctx)
    target, rows = model.target, {}
    prompts = builtin_prompt_ids(model, plan.lossless_prompts)
    bases = baseline_generations(model, prompts, plan)
    for method, method_cfg in configs.items():
        if ctx.time_left() <= 0:  # the part's truncation names what was not checked
            rows[method] = {"equal": 0, "checked": 0, "divergent": [], "seconds": [], "error": "budget spent"}
            continue
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
    from graft.run.lossless import compare

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


# --- part 8: lossless when sampling ------------------------------------------------------------------------

P_VALUE_FLOOR = 1e-3  # below it a method's first two tokens do not follow the target's distribution


def nucleus(logits, top_p: float):
    """softmax(logits) at temperature 1 cut to the smallest top set whose mass reaches top_p, renormalised
    (the rule graft.acceptance samples by; tests/core/test_sampling_loop.py checks the loop against it)."""
    import torch

    probs = torch.softmax(logits.double(), dim=-1)
    ranked, order = probs.sort(descending=True)
    keep = (ranked.cumsum(0) - ranked) < top_p
    out = torch.zeros_like(probs)
    out[order[keep]] = ranked[keep]
    return out / out.sum()


def joint_distribution(target, prompt: list[int], top_p: float) -> dict[tuple[int, int], float]:
    """P(t1, t2) of the target's own sampling, from plain prefills of the prompt and of the prompt + each t1."""
    import torch

    target.reset(len(prompt) + 4)
    first = nucleus(target.prefill(prompt).logits[-1].float().cpu(), top_p)
    joint = {}
    for t1 in torch.nonzero(first).flatten().tolist():
        target.reset(len(prompt) + 4)
        second = nucleus(target.prefill(prompt + [t1]).logits[-1].float().cpu(), top_p)
        for t2 in torch.nonzero(second).flatten().tolist():
            joint[(t1, t2)] = float(first[t1] * second[t2])
    return joint


def chi_square_p(pairs: list[tuple[int, int]], joint: dict) -> float:
    """Cells with an expected count of at least 5, the rest pooled into one."""
    from scipy.stats import chisquare

    expected = {cell: p * len(pairs) for cell, p in joint.items()}
    big = sorted(cell for cell, e in expected.items() if e >= 5)
    observed = [sum(1 for pair in pairs if pair == cell) for cell in big]
    wanted = [expected[cell] for cell in big]
    rest = len(pairs) - sum(wanted)
    if rest > 1e-9:  # a pooled cell only where some mass is left for it
        observed.append(len(pairs) - sum(observed))
        wanted.append(rest)
    if len(wanted) < 2:
        return 1.0  # one cell holds all the mass: nothing to test
    return float(chisquare(observed, [w * sum(observed) / sum(wanted) for w in wanted]).pvalue)


def sampled_row(target, drafter, prompt: list[int], joint: dict, draws: int, top_p: float) -> dict:
    """`draws` samples of a method's first two tokens at temperature 1 against the target's joint."""
    import torch

    from graft.decode import SamplingConfig, generate

    sampling, pairs = SamplingConfig(temperature=1.0, top_p=top_p), []
    for seed in range(draws):
        gen = generate(target, drafter, prompt, 2, set(), sampling, torch.Generator().manual_seed(seed))
        pairs.append(tuple(gen.new_tokens[:2]))
    p = chi_square_p(pairs, joint)
    return {"draws": draws, "p_value": round(p, 4), "lossless": p > P_VALUE_FLOOR}


def part_lossless_sampled(ctx: Context, out: dict) -> None:
    """Every method's first two tokens at temperature 1 follow the target's distribution (a chi-square over
    plan.sample_draws draws; few draws catch gross errors only) on tiny_llama in float32."""
    from baselines.autoregressive import Autoregressive
    from graft.config.hydra_setup import group_options
    from graft.registry import build_drafter

    plan = ctx.plan
    methods = ["ar", *(m for m in plan.lossless_methods or group_options("method") if m != "ar")]
    model, _ = load_tiny("tiny_llama", "float32", ctx)
    target = model.target
    prompt = builtin_prompt_ids(model, 1)[0][:24]
    joint = joint_distribution(target, prompt, plan.sample_top_p)
    out.update(model="tiny_llama", temperature=1.0, top_p=plan.sample_top_p, cells=len(joint), methods={})
    for k, method in enumerate(methods):
        if ctx.time_left() <= 0:
            out["truncated"] = f"budget spent; not checked: {methods[k:]}"
            break
        try:
            drafter = Autoregressive(target) if method == "ar" else build_drafter(method_config_of(method), target)
            out["methods"][method] = sampled_row(target, drafter, prompt, joint, plan.sample_draws, plan.sample_top_p)
        except Exception as err:  # one method's failure must not hide the others' results
            out["methods"][method] = {"error": f"{type(err).__name__}: {err}"[:1000], "lossless": False}
        ctx.checkpoint()
    rows = out["methods"].values()
    out["ratios"] = {"lossless": bool(rows) and all(r["lossless"] for r in rows) and "truncated" not in out}
    failed = [m for m, r in out["methods"].items() if not r["lossless"]]
    if failed or "truncated" in out:
        out["ratios"]["lossless_note"] = "; ".join(filter(None, [", ".join(failed), out.get("truncated")]))
