"""Measure a device's cost profile for the cost model (graft/costmodel): the target's verify time as a
function of tree nodes and context length, the decode loop's per-step overhead, and optionally the
drafters' step cost.

    python -m graft.costmodel profile [model=smollm2_135m hardware=cpu] [--out results/cost_model/cost_profile_cpu.json]
    python -m graft.costmodel profile hardware=gpu --methods eagle3,pruned,graft --repeats 9

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
- draft (`--methods`): each method's mean draft ms per step (propose + update) in the same loop on the
  dataset's first prompt, for projecting onto this device runs recorded elsewhere; `ar` always.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch

from graft.costmodel import AR, NODE_COUNTS, CostProfile
from graft.drafter import Drafter, Proposal, SequenceState
from graft.tree import DraftTree, NodeSource, topology

CPU_CONTEXTS = (64, 256, 1024, 4096)
GPU_CONTEXTS = (64, 256, 1024, 4096, 16384)


def filler_tokens(count: int, vocab: int, seed: int) -> list[int]:
    """Deterministic, unremarkable token ids (no model-specific meaning)."""
    return [(seed + 7919 * i) % vocab for i in range(count)]


def chain_tree(root: int, nodes: int, vocab: int, device) -> DraftTree:
    """A k-node chain: the same forward cost as any k-node tree (every node is one query row; the mask
    does not change the amount of work)."""
    if nodes == 1:
        return DraftTree.root_only(root, device)
    return DraftTree.chain(root, filler_tokens(nodes - 1, vocab, seed=11), NodeSource.DRAFT, device=device)


def elapsed_ms(fn, device: torch.device) -> float:
    """Milliseconds `fn()` takes: CUDA events on a GPU (the device's time, synchronised), else perf_counter."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


class ContextCache:
    """One prefilled cache of `length` filler tokens on `target`; verify(k) forwards a k-node tree on top of
    it and rolls the cache back, so every call sees the same context."""

    def __init__(self, target, length: int, max_nodes: int):
        self.target, self.length = target, length
        target.reset(length + max_nodes + 8)
        target.prefill(filler_tokens(length, target.vocab_size, seed=101))
        self.cache = target.cache
        self.committed = target.cache_len

    @torch.inference_mode()
    def verify_ms(self, nodes: int) -> float:
        target = self.target
        target.cache = self.cache  # the caches of all contexts share one target
        tree = chain_tree(17, nodes, target.vocab_size, target.device)
        topo = topology(tree.parents, self.committed)  # the loop's overhead, not the forward's: outside
        ms = elapsed_ms(lambda: target.verify(tree, topo), target.device)
        self.cache.keep(self.committed, None, 0)
        return ms


def measure_verify(target, nodes: list[int], contexts: list[int], repeats: int, warmup: int) -> list[list[float]]:
    """[len(contexts)][len(nodes)] median verify ms, measured round-robin."""
    caches = [ContextCache(target, c, max(nodes)) for c in contexts]
    samples = [[[] for _ in nodes] for _ in contexts]
    for round_ in range(warmup + repeats):
        flip = round_ % 2 == 1  # alternate the order, so no size always follows the same neighbour
        for ci in reversed(range(len(contexts))) if flip else range(len(contexts)):
            for ni in reversed(range(len(nodes))) if flip else range(len(nodes)):
                ms = caches[ci].verify_ms(nodes[ni])
                if round_ >= warmup:
                    samples[ci][ni].append(ms)
    return [[statistics.median(cell) for cell in row] for row in samples]


class FixedChainDrafter(Drafter):
    """Proposes the same k-node chain of filler tokens every step (mostly rejected: 1 token a step)."""

    def __init__(self, target, nodes: int):
        super().__init__(target)
        self.nodes = nodes

    def max_nodes(self) -> int:
        return self.nodes

    def propose(self, state: SequenceState) -> Proposal:
        return Proposal(chain_tree(state.root, self.nodes, self.target.vocab_size, self.target.device))


def loop_run(target, drafter, prompt: list[int], steps: int, baseline: bool):
    """The decode loop for `steps` steps of `drafter` (no stop token): its per-step draft / verify / other.
    The baseline runs as runs run it: recording the top-2 logit gaps of its tokens for the lossless check
    (graft/runner.py), a cost in its `other` that the measured speedup_decode includes."""
    from graft.decode import generate

    return generate(target, drafter, prompt, max_new_tokens=steps + 1, stop_ids=set(), record_gaps=baseline)


def measure_overhead(target, nodes: list[int], context: int, steps: int, verify_at) -> tuple[list[float], float]:
    """(overhead ms per node count, the baseline's draft ms per step) from the decode loop at `context`."""
    from baselines.autoregressive import Autoregressive

    prompt = filler_tokens(context, target.vocab_size, seed=101)
    drafters = {k: Autoregressive(target) if k == 1 else FixedChainDrafter(target, k) for k in nodes}
    for k, drafter in drafters.items():  # warm-up, untimed
        loop_run(target, drafter, prompt, 3, baseline=k == 1)
    overhead, ar_draft = [], 0.0
    for k, drafter in drafters.items():
        gen = loop_run(target, drafter, prompt, steps, baseline=k == 1)
        if target.device.type == "cuda" and not getattr(target, "sync_timing", False):
            # with hardware.timing=async the host's split is not the device's: the step's non-draft time
            # minus the event-timed forward at the same context
            non_draft = [1e3 * (v + o) for v, o in zip(gen.verify_s, gen.other_s)]
            overhead.append(max(0.0, statistics.median(non_draft) - verify_at(k, context + steps // 2)))
        else:
            overhead.append(1e3 * statistics.median(gen.other_s))
        if k == 1:
            ar_draft = 1e3 * statistics.fmean(gen.draft_s)
    return overhead, ar_draft


@torch.inference_mode()
def measure_commit_move(target, repeats: int) -> float:
    """Extra ms of a commit whose accepted path must be moved down in the cache (a tree's path off its first
    nodes: every layer's keys and values gathered) over one that keeps only the root, median of repeats."""
    cache = ContextCache(target, 256, 32)
    tree = chain_tree(17, 32, target.vocab_size, target.device)
    target.cache = cache.cache
    target.verify(tree, topology(tree.parents, cache.committed))  # 32 rows to move from
    path = [0, 3, 9, 20]  # root, then three nodes off their place
    path_index = torch.tensor(path, device=target.device)

    def commit_ms(keep: list[int], index) -> float:
        for layer in cache.cache.layers:  # the tree's rows back in place, as after a verify
            layer.length = cache.committed + 32
        return elapsed_ms(lambda: target.commit(cache.committed, keep, index), target.device)

    moved, in_place = [], []
    for _ in range(repeats + 2):
        moved.append(commit_ms(path, path_index))
        in_place.append(commit_ms([0], None))
    return max(0.0, statistics.median(moved[2:]) - statistics.median(in_place[2:]))


def measure_drafts(model, cfg, names: list[str], tokens: int) -> dict[str, float]:
    """{method: mean draft ms per step} in the decode loop on the dataset's first prompt."""
    from graft.config import compared_methods
    from graft.data import load_prompts
    from graft.decode import generate
    from graft.registry import build_drafter

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


def device_label(target, fast_path: str) -> str:
    from graft.records import hardware_info

    info = hardware_info(str(target.device))
    if target.device.type == "cuda":
        return f"cuda: {info.get('gpu')}"
    return f"cpu: {info['cpu']} ({torch.get_num_threads()} threads, fast path {fast_path})"


def main(argv: list[str] | None = None) -> None:
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
    parser.add_argument("--out", type=Path, help="default: results/cost_profile_<model>_<hardware>.json")
    args = parser.parse_args(argv)

    from graft.config import compose, validate
    from graft.models import load_model

    cfg = validate(compose([*args.overrides, "logger=none"]))
    started = time.perf_counter()
    model = load_model(cfg.model, cfg.hardware, progress=False)
    target = model.target
    nodes = sorted({int(n) for n in args.nodes.split(",")})
    default = GPU_CONTEXTS if target.device.type == "cuda" else CPU_CONTEXTS
    wanted = [int(c) for c in args.contexts.split(",")] if args.contexts else list(default)
    longest = target.max_context - max(nodes) - 8  # a tree must fit after its context
    contexts = sorted({min(c, longest) for c in wanted})
    print(f"{cfg.model.name} on {target.device} ({cfg.hardware.fast_path}), contexts {contexts}, nodes {nodes}")

    verify = measure_verify(target, nodes, contexts, args.repeats, args.warmup)
    verify_only = CostProfile("", cfg.model.name, nodes, contexts, verify, [0.0] * len(nodes))  # for CUDA's overhead
    overhead, ar_draft = measure_overhead(target, nodes, args.loop_context, args.loop_steps, verify_only.verify_ms)
    commit_move = measure_commit_move(target, 4 * args.repeats)
    drafts = {AR: ar_draft}
    if args.methods:
        drafts.update(measure_drafts(model, cfg, args.methods.split(","), args.draft_tokens))

    profile = CostProfile(
        device=device_label(target, cfg.hardware.fast_path),
        model=cfg.model.name,
        nodes=nodes,
        contexts=contexts,
        verify_table_ms=verify,
        overhead_table_ms=overhead,
        commit_move_ms=commit_move,
        draft_step_ms=drafts,
        meta={
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "overrides": args.overrides,
            "fast_path": cfg.hardware.fast_path,
            "dtype": str(target.dtype),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "loop_steps": args.loop_steps,
            "loop_context": args.loop_context,
            "seconds": round(time.perf_counter() - started, 1),
        },
    )
    print(f"verify ms (median of {args.repeats}); rows = nodes, columns = context")
    print("nodes " + "".join(f"{c:>9}" for c in contexts) + "   overhead")
    for ni, k in enumerate(nodes):
        print(f"{k:>5} " + "".join(f"{row[ni]:>9.2f}" for row in verify) + f"   {overhead[ni]:>8.2f}")
    print(f"moving an accepted path in the cache {commit_move:.3f} ms; ar draft {ar_draft:.3f} ms/step")
    print(f"{profile.meta['seconds']} s in all")
    out = args.out or Path(f"results/cost_profile_{cfg.model.name}_{cfg.hardware.name}.json")
    profile.save(out)
    print(f"wrote {out}")
