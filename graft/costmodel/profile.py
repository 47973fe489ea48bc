"""Measure a device's cost profile for the cost model (graft/costmodel): the target's verify time as a
function of tree nodes and context length, the decode loop's per-step overhead, and optionally the
drafters' step cost.

    python -m graft.costmodel profile [model=smollm2_135m hardware=cpu] [--out results/cost_model/cost_profile_cpu.json]
    python -m graft.costmodel profile hardware=gpu --methods eagle3,pruned,graft --repeats 9
    python -m graft.costmodel profile --batch 8 [--out results/cost_model/cost_profile_cpu_b8.json]

- verify: the forward the decode loop runs (a k-node tree on top of a C-token cache, the tree mask built
  inside, as target.verify does), after warm-up rounds, median over repeats. One cache per context is
  prefilled once and rolled back after each forward, so every repeat sees the same context; contexts and
  node counts are measured round-robin (alternating order), so machine noise hits them alike. CUDA is timed
  with CUDA events around the forward, the CPU with perf_counter.
- overhead: the decode loop itself (graft/decode.py `generate`) with a drafter that proposes a fixed
  k-node chain; the loop's own `other` time per step (topology, acceptance, cache commit, bookkeeping),
  median over steps; the baseline's with its top-2 gap recording, as runs time it. On CUDA the loop
  synchronises at each phase boundary (hardware.timing=sync, the default there), so its split is the
  device's; with timing=async it is not (kernels run asynchronously), and the overhead is then the step's
  non-draft time minus the event-timed verify at the same context.
- commit move: those chains are rejected, so their commits keep only the root; a tree step that accepts
  2+ tokens also moves its path down in the cache (every layer's keys and values gathered), timed directly.
- experts (MoE targets): the distinct experts per layer each tree size's verify touched, and verify time at the
  largest size with the routing pinned to a growing number of experts; its slope, expert_ms, is what one more
  expert read costs in one layer (graft/budget/experts.py).
- draft (`--methods`): each method's mean draft ms per step (propose + update) in the same loop on the
  dataset's first prompt, for projecting onto this device runs recorded elsewhere; `ar` always.
- batch (`--batch B`, default 1): the verify table is one forward of B trees of k nodes each, every row after
  the context (TargetBackend.verify_rows over B slots, on the run's forward, as run.batch_size=B runs);
  the overhead, commit move and draft costs stay one sequence's, and an MoE target's experts are not measured.
  `project` with such a profile projects runs to batch B.

The measurements live in measure.py (shared with method.cost_profile=auto); the profile names the model, its
shape hash, dtype, machine and engine it was measured on, which an auto-budget method checks against its target.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch

from graft.budget.measure import (
    ContextCache,
    identity,
    measure_commit_move,
    measure_experts,
    measure_overhead,
    measure_verify,
    one_sequence_verify,
)
from graft.budget.profile import AR, NODE_COUNTS, CostProfile

CPU_CONTEXTS = (64, 256, 1024, 4096)
GPU_CONTEXTS = (64, 256, 1024, 4096, 16384)


def measure_drafts(model, cfg, names: list[str], tokens: int) -> dict[str, float]:
    """{method: mean draft ms per step} in the decode loop on the dataset's first prompt."""
    from graft.config.comparison import compared_methods
    from graft.data.loading import load_prompts
    from graft.decode import generate
    from graft.registry import build_drafter

    names = [name for name in names if name != AR]  # the baseline's draft cost is always measured
    if not names:
        return {}
    prompt = load_prompts(cfg.dataset, cfg.paths.data_root, model.chat)[0]
    ids = model.chat.prompt_ids([{"role": "user", "content": prompt.turns[0]}])
    costs = {}
    for method in compared_methods(names, {}, cfg.model):
        drafter = build_drafter(method, model.target)
        generate(model.target, drafter, ids, 16, model.stop_ids)  # warm-up, untimed
        gen = generate(model.target, drafter, ids, tokens, model.stop_ids)
        costs[method.name] = 1e3 * statistics.fmean(gen.draft_s)
        print(f"  draft {method.name}: {costs[method.name]:.2f} ms/step over {gen.steps} steps")
    return costs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m graft.costmodel profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=smollm2_135m hardware=cpu")
    parser.add_argument("--nodes", default=",".join(map(str, NODE_COUNTS)), help="tree sizes, root included")
    parser.add_argument("--contexts", help="context lengths (default: 64,256,1024,4096, +16384 on a GPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loop-steps", type=int, default=12, help="decode-loop steps per node count (overhead)")
    parser.add_argument("--loop-context", type=int, default=128, help="prompt length of those loop runs")
    parser.add_argument("--methods", default="", help="methods whose draft ms per step to measure, e.g. eagle3,graft")
    parser.add_argument("--draft-tokens", type=int, default=64)
    parser.add_argument(
        "--batch", type=int, default=1, help="sequences per verify forward: the verify of B trees (run.batch_size)"
    )
    parser.add_argument("--out", type=Path, help="default: results/cost_profile_<model>_<hardware>[_b<B>].json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked
    from graft.load.models import load_model
    from graft.run.batched import batched_hardware
    from graft.schema import ConfigError

    if args.batch < 1:
        raise ConfigError(f"--batch {args.batch}: expected an integer >= 1 (sequences per verify forward)")
    cfg = validate(compose_checked([*args.overrides, "logger=none"]))
    hardware = batched_hardware(cfg.hardware, args.batch)  # as a batched run: eager, one device
    started = time.perf_counter()
    model = load_model(cfg.model, hardware, progress=False)
    target = model.target
    nodes = sorted({int(n) for n in args.nodes.split(",")})
    default = GPU_CONTEXTS if target.device.type == "cuda" else CPU_CONTEXTS
    wanted = [int(c) for c in args.contexts.split(",")] if args.contexts else list(default)
    longest = target.max_context - max(nodes) - 8  # a tree must fit after its context
    contexts = sorted({min(c, longest) for c in wanted})
    batched = f", batch {args.batch}" if args.batch > 1 else ""
    print(f"{cfg.model.name} on {target.device} ({hardware.fast_path}){batched}, contexts {contexts}, nodes {nodes}")

    profile = measure_profile(model, cfg, args, nodes=nodes, contexts=contexts, fast_path=hardware.fast_path)
    profile.meta["seconds"] = round(time.perf_counter() - started, 1)
    print_profile(profile, args.repeats)
    suffix = f"_b{args.batch}" if args.batch > 1 else ""
    out = args.out or Path(f"results/cost_profile_{cfg.model.name}_{cfg.hardware.name}{suffix}.json")
    profile.save(out)
    print(f"wrote {out}")


def measure_profile(model, cfg, args, *, nodes: list[int], contexts: list[int], fast_path: str) -> CostProfile:
    """Every cost of the profile measured on the loaded model (the module docstring says how): verify, the loop's
    overhead, the commit move, an MoE target's experts and the drafts."""
    target = model.target
    verify = measure_verify(target, nodes, contexts, args.repeats, args.warmup, batch=args.batch)
    verify_only = CostProfile("", cfg.model.name, nodes, contexts, verify, [0.0] * len(nodes))  # for CUDA's overhead
    verify_at = verify_only.verify_ms
    if args.batch > 1:  # the loop decodes one sequence: CUDA's host-timed overhead subtracts one tree's forward
        verify_at = one_sequence_verify(target, nodes, args.loop_context, args.repeats, None)
    overhead, ar_draft = measure_overhead(target, nodes, args.loop_context, args.loop_steps, verify_at)
    commit_move = measure_commit_move(target, 4 * args.repeats)
    # an MoE target: experts touched by tree size, and the price of one more expert read (None when dense); at
    # batch B the B trees route apart, so not measured there
    moe = None
    if args.batch == 1:
        moe = measure_experts(target, ContextCache(target, contexts[0], max(nodes)), nodes, args.repeats)
    drafts = {AR: ar_draft}
    if args.methods:
        drafts.update(measure_drafts(model, cfg, args.methods.split(","), args.draft_tokens))

    return CostProfile(
        **identity(target, args.batch),
        nodes=nodes,
        contexts=contexts,
        verify_table_ms=verify,
        overhead_table_ms=overhead,
        commit_move_ms=commit_move,
        draft_step_ms=drafts,
        moe=moe or {},
        meta={
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "overrides": args.overrides,
            "fast_path": fast_path,
            "dtype": str(target.dtype),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "loop_steps": args.loop_steps,
            "loop_context": args.loop_context,
        },
    )


def print_profile(profile: CostProfile, repeats: int) -> None:
    """The measured tables as the console shows them: verify ms by nodes and context, the overhead beside them."""
    contexts, verify, overhead, moe = profile.contexts, profile.verify_table_ms, profile.overhead_table_ms, profile.moe
    if profile.batch > 1:
        print(
            f"verify ms of one forward of {profile.batch} trees (median of {repeats}); rows = nodes per tree, "
            "columns = context; overhead per sequence"
        )
    else:
        print(f"verify ms (median of {repeats}); rows = nodes, columns = context")
    print("nodes " + "".join(f"{c:>9}" for c in contexts) + "   overhead")
    for ni, k in enumerate(profile.nodes):
        print(f"{k:>5} " + "".join(f"{row[ni]:>9.2f}" for row in verify) + f"   {overhead[ni]:>8.2f}")
    print(
        f"moving an accepted path in the cache {profile.commit_move_ms:.3f} ms; "
        f"ar draft {profile.draft_step_ms[AR]:.3f} ms/step"
    )
    if moe:
        print(f"experts touched per layer by nodes: {moe['experts_touched']}")
        sweep = ", ".join(f"{m}: {ms:.2f}" for m, ms in zip(moe["sweep_experts"], moe["sweep_ms"]))
        print(
            f"verify ms of {moe['sweep_nodes']} nodes by experts pinned ({sweep}): {moe['expert_ms']:.3f} ms an expert a layer"
        )
    print(f"{profile.meta['seconds']} s in all")
