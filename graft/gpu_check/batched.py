"""Part 9 of the device check: run.batch_size = 8 through graft/batch.py (generate_batch), greedy, for ar, eagle3
and graft on the device the check targets (FULL: an 8-layer slice of the 8B shape, random weights, bf16 with a
random EAGLE-3 head; QUICK and CPU: tiny_llama in float32), with the settings a batch runs on a GPU (fixed-size
trees, device acceptance, hardware.tree_bucket=0 as graft/run/batched.py: batched_hardware sets it):

- host syncs per batched step, counted at the dispatcher (sync_counter.py: SyncCounter, any device, as
  tests/gpu/test_batch_syncs.py counts them) and on CUDA under torch.cuda.set_sync_debug_mode("warn") too; a step
  in which sequences leave reads their records back, all in one copy (graft/batch.py: _Run.flush), and is
  reported on its own;
- lossless: every sequence's tokens against batch-1 AR's (graft.decode.generate) on the same prompts, the float
  ties part 2 allows allowed (graft/run/lossless.py: compare);
- tokens/s of the batch over batch-1 AR's on the same prompts (informative: no goal).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from graft import batch as batching
from graft.gpu_check.measure import (
    as_conversation,
    hardware_config,
    harness_target,
    load_tiny,
    method_config_of,
    random_causal_lm,
    random_ids,
    ratio,
    rounded,
    sync,
)
from graft.gpu_check.plan import RANDOM_NOTE, Plan
from graft.gpu_check.report import Context, traceback_tail
from graft.gpu_check.sync_counter import SyncCounter, _snapshot, sites_of, syncs_of
from graft.gpu_check.syncs import debug_mode_sites

WARMUP_TOKENS = 4  # the warm-up run: every slot's drafter sets itself up lazily on its first sequence


@dataclass
class Baseline:
    """Batch-1 AR on the part's prompts: what every batch is checked and timed against."""

    prompts: list[list[int]]
    gens: dict  # {prompt: Generation}, with the top-2 gaps the tie rule reads
    tokens_per_s: float | None
    ulps: int | None  # run.float_tie_ulps (graft/run/lossless.py: float_tie)


def part_batched(ctx: Context, out: dict) -> None:
    """ar, eagle3 and graft at B = plan.batch_size: syncs per batched step, lossless against batch-1 AR, tokens/s."""
    from graft.config.experiment import compose, validate

    plan = ctx.plan
    ulps = validate(compose(["logger=none"])).run.float_tie_ulps  # part 2's tie rule: run.float_tie_ulps
    with batch_target(ctx, out) as (target, overrides):
        prompts = batch_prompts(plan, target.vocab_size)
        out.update(
            batch_size=plan.batch_size,
            prompts=len(prompts),
            prompt_tokens=[len(p) for p in prompts],
            max_new_tokens=plan.batch_tokens,
            fixed_size_trees=target.fixed_size_trees,
            tree_bucket=target.tree_bucket,
            note=RANDOM_NOTE,
        )
        gens, seconds = batch1_ar(target, prompts, tokens=plan.batch_tokens)
        out["ar_batch1"] = throughput(gens.values(), seconds)
        baseline = Baseline(prompts, gens, out["ar_batch1"]["tokens_per_s"], ulps)
        ctx.checkpoint()
        out["methods"] = {}
        for k, name in enumerate(plan.batch_methods):
            if ctx.time_left() <= 0:
                out["truncated"] = f"budget spent; not run: {list(plan.batch_methods[k:])}"
                break
            out["methods"][name] = method_row(ctx, target, name=name, overrides=overrides, baseline=baseline)
            ctx.checkpoint()
    out["ratios"] = batch_ratios(out, cuda=ctx.cuda)


@contextlib.contextmanager
def batch_target(ctx: Context, out: dict) -> Iterator[tuple[object, list[str]]]:
    """(the target with a batch's GPU settings, the method overrides its drafters need), for the block: plan.batch_model
    loaded as part 3 loads it, or the 8B shape's first plan.batch_layers layers built on the device with a random
    EAGLE-3 head saved for the block (as part 4 builds them)."""
    from graft.gpu_check.dense import save_random_head

    plan = ctx.plan
    if plan.batch_model is not None:
        model, _ = load_tiny(plan.batch_model, "float32", ctx, ["hardware.tree_bucket=0"])
        target = model.target
        # on a CPU, small trees take host paths that read on purpose (graft.ops.Ops.on_host); count the device path
        target.ops.host_paths = False
        out.update(model=plan.batch_model, dtype="float32")
        yield target, []
        return
    arch = {**plan.dense_arch, "num_hidden_layers": min(plan.batch_layers, plan.dense_arch["num_hidden_layers"])}
    out.update(model="llama31_8b-shaped", arch=arch, dtype=plan.dtype)
    model = random_causal_lm("llama", arch, ctx.device, getattr(torch, plan.dtype))
    target = harness_target(model, hardware_config(ctx), "batch_8b_shaped")
    target.tree_bucket = 0  # graft/run/batched.py: batched_hardware (padded rows are verified at one width)
    target.ops.host_paths = False
    with tempfile.TemporaryDirectory(prefix="gpu_check_batch_head_") as tmp:
        out["head"] = save_random_head(target, plan, Path(tmp) / "head")
        yield target, [f"method.head={Path(tmp) / 'head'}"]


def batch_prompts(plan: Plan, vocab: int) -> list[list[int]]:
    """plan.batch_prompts prompts of random ids, their lengths drawn in plan.batch_prompt_lens (ragged, so the
    newcomers' chunks and the padded rows are exercised)."""
    low, high = plan.batch_prompt_lens
    lengths = torch.randint(low, high, (plan.batch_prompts,), generator=torch.Generator().manual_seed(9)).tolist()
    return [random_ids(n, vocab, seed=100 + k) for k, n in enumerate(lengths)]


def batch1_ar(target, prompts: list[list[int]], *, tokens: int) -> tuple[dict, float]:
    """Batch-1 AR on every prompt ({prompt: Generation} with the top-2 gaps the tie rule reads) and its seconds."""
    from baselines.autoregressive import Autoregressive
    from graft.decode import generate

    drafter = Autoregressive(target)
    generate(target, drafter, prompts[0][:8], 4, set())  # warm-up: lazy setup is not decoding
    sync(target.device)
    start = time.perf_counter()
    bases = {k: generate(target, drafter, p, tokens, set(), record_gaps=True) for k, p in enumerate(prompts)}
    sync(target.device)
    return bases, time.perf_counter() - start


def slot_drafters(name: str, target, *, size: int, overrides: list[str]) -> list:
    """One drafter per slot, built as graft/run/batched.py: measure_batched builds them (slot 0's shared state, the
    head's weights, taken by the others)."""
    from baselines.autoregressive import Autoregressive
    from graft.registry import build_drafter

    if name == "ar":
        return [Autoregressive(target) for _ in range(size)]
    cfg = method_config_of(name, overrides)
    drafters = [build_drafter(cfg, target, size) for _ in range(size)]
    for other in drafters[1:]:
        other.share_with(drafters[0])
    return drafters


def run_batch(target, drafters: list, *, prompts: list[list[int]], tokens: int, record_gaps: bool = False):
    """generate_batch over `prompts`, greedy: ({prompt: Generation}, seconds, the device's work included)."""
    from graft.batch import BatchRequest, generate_batch, slot_capacity
    from graft.decode import SamplingConfig

    done: dict = {}
    queue = deque(BatchRequest(p, None, tag=k) for k, p in enumerate(prompts))
    capacity = slot_capacity([len(p) for p in prompts], tokens, max(d.max_nodes() for d in drafters))
    sync(target.device)
    start = time.perf_counter()
    generate_batch(
        target,
        drafters,
        queue,
        tokens,
        set(),
        SamplingConfig(),
        capacity,
        lambda request, gen, slot: done.__setitem__(request.tag, gen),
        record_gaps=record_gaps,
    )
    sync(target.device)
    return done, time.perf_counter() - start


def allowed_reads(found: dict) -> int:
    """What a round of the batch loop may read: the step's one read, one for every leaver's records together, one
    per newcomer's first token (sampled from its prefill's logits before its drafter starts)."""
    return 1 + (found["left"] > 0) + found["first"]


@contextlib.contextmanager
def counted_rounds(snapshots: dict[str, Callable[[], Counter]]) -> Iterator[list[dict]]:
    """Per round of graft.batch's loop (the newcomers' prefill gap, the step, then _Run.flush: the records of the
    sequences that left in it, read back in one copy): {"counts": {name: what snapshots[name]() gained in it},
    "left": leavers, "first": newcomers whose prompt ended in the gap, "verified": whether the step verified a
    slot (a step whose every slot left for want of context verifies none)}. The class is patched for the block
    only. tests/gpu/test_batch_syncs.py and part 9 count through this one helper."""
    rounds: list[dict] = []
    current: dict = {}
    gap, step, flush = batching._Run.prefill_gap, batching._Run.step, batching._Run.flush

    def begin() -> None:
        current.setdefault("before", {k: snap() for k, snap in snapshots.items()})

    def counted_gap(run, live, filling):
        begin()
        decoding = len(live)
        gap(run, live, filling)
        current["first"] = current.get("first", 0) + len(live) - decoding

    def counted_step(run, *args, **kwargs):
        begin()
        result = step(run, *args, **kwargs)
        current["verified"] = bool(result.get("slots"))
        return result

    def counted_flush(run):
        left = len(run.leaving)
        flush(run)
        before = current.pop("before", None)
        if before is not None:
            counts = {k: snap() - before[k] for k, snap in snapshots.items()}
            found = {"left": left, "first": current.get("first", 0), "verified": current.get("verified", False)}
            rounds.append({"counts": counts, **found})
        current.clear()

    batching._Run.prefill_gap, batching._Run.step, batching._Run.flush = counted_gap, counted_step, counted_flush
    try:
        yield rounds
    finally:
        batching._Run.prefill_gap, batching._Run.step, batching._Run.flush = gap, step, flush


def counted_run(target, drafters: list, *, prompts: list[list[int]], tokens: int, cuda: bool) -> dict:
    """Syncs per round of one run: at the dispatcher, and on CUDA under sync debug mode in the same run."""
    counter = SyncCounter()
    with contextlib.ExitStack() as stack:
        snapshots = {"dispatcher": lambda: _snapshot(counter)}
        if cuda:
            snapshots["debug_mode"] = stack.enter_context(debug_mode_sites())
        rounds = stack.enter_context(counted_rounds(snapshots))
        stack.enter_context(counter)
        run_batch(target, drafters, prompts=prompts, tokens=tokens)
    return steps_row([r for r in rounds if r["verified"]], cuda=cuda)


def steps_row(rounds: list[dict], *, cuda: bool) -> dict:
    """The mean and worst step's syncs over the rounds no sequence left or joined in, their kinds and the worst
    step's places; and the rounds sequences left or joined in, each against what it may read (allowed_reads)."""
    steps = [r["counts"] for r in rounds if not r["left"] and not r["first"]]
    others = [r for r in rounds if r["left"] or r["first"]]
    counts = [sum(syncs_of(s["dispatcher"]).values()) for s in steps]
    excess = [sum(syncs_of(r["counts"]["dispatcher"]).values()) - allowed_reads(r) for r in others]
    kinds: Counter = Counter()
    for s in steps:
        kinds.update(syncs_of(s["dispatcher"]))
    row = {
        "steps": len(counts),
        "mean": round(sum(counts) / len(counts), 2) if counts else None,
        "max": max(counts, default=None),
        "kinds": dict(kinds),
        "worst_step_sites": dict(Counter(sites_of(steps[counts.index(max(counts))]["dispatcher"])).most_common(8))
        if counts
        else {},
        "leaving_steps": sum(1 for r in others if r["left"]),
        "joining_steps": sum(1 for r in others if r["first"]),
        "leave_join_excess_max": max(excess, default=None),
    }
    if cuda:
        debug = [sum(s["debug_mode"].values()) for s in steps]
        row["debug_mode_max"] = max(debug, default=None)
        row["debug_mode_mean"] = round(sum(debug) / len(debug), 2) if debug else None
        row["debug_mode_worst_sites"] = (
            dict(steps[debug.index(max(debug))]["debug_mode"].most_common(8)) if debug else {}
        )
    return row


def method_row(ctx: Context, target, *, name: str, overrides: list[str], baseline: Baseline) -> dict:
    """One method at B = plan.batch_size: a warm-up, a counted run and a timed one (its tokens checked)."""
    plan, prompts, tokens = ctx.plan, baseline.prompts, ctx.plan.batch_tokens
    try:
        drafters = slot_drafters(name, target, size=plan.batch_size, overrides=overrides)
        warm = [p[:8] for p in prompts[: plan.batch_size]]
        run_batch(target, drafters, prompts=warm, tokens=WARMUP_TOKENS)
        row = counted_run(target, drafters, prompts=prompts, tokens=tokens, cuda=ctx.cuda)
        # the timed run records the top-2 gaps as batch-1 AR's does: the same work per step on both sides
        done, seconds = run_batch(target, drafters, prompts=prompts, tokens=tokens, record_gaps=True)
        row.update(throughput(done.values(), seconds))
        row["tokens_per_s_over_ar_batch1"] = ratio(row["tokens_per_s"], baseline.tokens_per_s)
        row["lossless"] = lossless_of(done, baseline.gens, dtype=target.dtype, ulps=baseline.ulps)
    except Exception as err:  # one method's failure (a GPU-path bug) must not hide the others' figures
        return {"error": f"{type(err).__name__}: {err}"[:1000], "traceback": traceback_tail(err, 6)}
    return row


def throughput(gens, seconds: float) -> dict:
    tokens = sum(len(g.new_tokens) for g in gens)
    return {"new_tokens": tokens, "seconds": rounded(seconds), "tokens_per_s": rounded(tokens / seconds, 2)}


def lossless_of(done: dict, bases: dict, *, dtype: torch.dtype, ulps: int | None) -> dict:
    """Every sequence's tokens against batch-1 AR's on its prompt, a divergence excused only where the baseline's
    top-2 gap there is a float tie (graft/run/lossless.py: compare, as part 2 decides)."""
    from graft.run.lossless import compare

    row: dict = {"equal": 0, "checked": 0, "divergent": []}
    for k, base in bases.items():
        if k not in done:
            row["divergent"].append({"prompt": k, "missing": True, "float_tie": False})
            continue
        verdict = compare(as_conversation(done[k]), as_conversation(base), dtype, ulps)
        row["checked"] += 1
        row["equal"] += verdict["equal"]
        if not verdict["equal"]:
            row["divergent"].append({"prompt": k, **verdict["first_divergence"]})
    row["lossless"] = all(d["float_tie"] for d in row["divergent"])
    return row


def batch_ratios(out: dict, *, cuda: bool) -> dict:
    """The worst step of the worst method, lossless over every method, and each method's tokens/s over AR's."""
    rows = out.get("methods", {})
    counted = [r for r in rows.values() if "error" not in r]

    def worst(field: str):
        values = [r[field] for r in counted if r.get(field) is not None]
        return max(values) if values else None

    failed = [m for m, r in rows.items() if "error" in r or not r["lossless"]["lossless"]]
    ratios = {
        "batch_syncs_per_step_max": worst("max"),
        "batch_leave_join_excess_max": worst("leave_join_excess_max"),
        "batch_debug_syncs_per_step_max": worst("debug_mode_max"),
        "batch_lossless": bool(rows) and not failed and "truncated" not in out,
        **{f"batch_{m}_over_ar1": r.get("tokens_per_s_over_ar_batch1") for m, r in rows.items()},
    }
    if failed or "truncated" in out:
        ratios["batch_lossless_note"] = "; ".join(filter(None, [", ".join(failed), out.get("truncated")]))
    errors = [m for m, r in rows.items() if "error" in r]
    if errors:
        ratios["batch_syncs_per_step_max_note"] = f"not counted (failed): {', '.join(errors)}"
    if not cuda:
        ratios["batch_debug_syncs_per_step_max_note"] = "sync debug mode needs CUDA"
    return ratios
