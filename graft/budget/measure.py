"""Measuring a target's costs on the machine it runs on: the verify forward by tree size and context, the
decode loop's overhead and the commit move (what `python -m graft.costmodel profile` writes), and
`calibrated_profile`, the profile `method.cost_profile=auto` reads: measured when an auto-budget drafter is
built for a loaded target, cached per machine, model, dtype and engine (`identity`), so that the next run
loads it. At run.batch_size=B the verify table is one forward of B trees (`BatchContextCache`), cached apart from
batch 1's. No import of the CPU engine: graft.methods reads this module (tests/harness/test_structure.py).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from graft.budget.profile import AR, CostProfile, cpu_model, interpolate
from graft.drafter import Drafter, Proposal, SequenceState
from graft.tree import DraftTree, NodeSource, topology

log = logging.getLogger(__name__)

# cached positions the calibration times: around the built-in prompts (40-170 tokens) and their later turns;
# shorter contexts read the first, longer ones are extrapolated
CALIBRATION_CONTEXTS = (128, 512)
# about the most a calibration takes: the verify rounds stop after half of it (3 timed rounds at least)
CALIBRATION_SECONDS = 20.0
# the config fields that set a forward's cost; the weights' values do not
SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_experts",
    "num_experts_per_tok",
    "tie_word_embeddings",
)


def filler_tokens(count: int, vocab: int, seed: int) -> list[int]:
    """Deterministic, unremarkable token ids (no model-specific meaning)."""
    return [(seed + 7919 * i) % vocab for i in range(count)]


def chain_tree(root: int, nodes: int, vocab: int, device) -> DraftTree:
    """A k-node chain: the same forward cost as any k-node tree (every node is one query row; the mask
    does not change the amount of work)."""
    if nodes == 1:
        return DraftTree.root_only(root, device)
    return DraftTree.chain(root, filler_tokens(nodes - 1, vocab, seed=11), NodeSource.DRAFT, device=device)


def cuda_devices(target) -> list[torch.device]:
    """Every GPU the target's weights span (a sharded target's layers sit on several)."""
    return [d for d in getattr(target, "devices", [target.device]) if d.type == "cuda"]


def elapsed_ms(fn, target) -> float:
    """Milliseconds `fn()` takes on `target`: on GPUs, every device it spans synchronised first (so nothing
    queued before is counted) and CUDA events on the LM head's device's stream, which finishes a sharded
    forward last; on a CPU, perf_counter."""
    gpus = cuda_devices(target)
    if gpus:
        for device in gpus:
            torch.cuda.synchronize(device)
        stream = torch.cuda.current_stream(target.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
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
        ms = elapsed_ms(lambda: target.verify(tree, topo), target)
        self.cache.keep(self.committed, None, 0)
        return ms


class BatchContextCache:
    """`batch` slots (graft/backends/slots.py), each prefilled with the same `length` filler tokens; verify_ms(k)
    forwards `batch` k-node trees in one TargetBackend.verify_rows, as a batched step does (graft/batch.py), and
    rolls every slot back. The forward reads each slot's whole capacity (the mask hides the rest), so the slots
    hold the context and the tree alone: a run whose slots are sized for longer conversations pays more."""

    def __init__(self, target, batch: int, length: int, max_nodes: int):
        from graft.backends.slots import SlotCaches

        self.target, self.length = target, length
        self.slots = SlotCaches(target, batch, length + max_nodes + 8, ops=target.ops)
        ids = filler_tokens(length, target.vocab_size, seed=101)
        for cache in self.slots.slot:  # each slot prefilled alone, as a newcomer is
            target.cache = cache
            target.prefill(ids)
        self.committed = length

    @torch.inference_mode()
    def verify_ms(self, nodes: int) -> float:
        target, rows = self.target, len(self.slots.slot)
        tree = chain_tree(17, nodes, target.vocab_size, target.device)
        topo = topology(tree.parents, self.committed)  # outside the timing, as in ContextCache
        ms = elapsed_ms(lambda: target.verify_rows(self.slots, 0, [tree] * rows, [topo] * rows), target)
        for cache in self.slots.slot:
            cache.keep(self.committed, None, 0)
        return ms


def measure_verify(
    target,
    nodes: list[int],
    contexts: list[int],
    repeats: int,
    warmup: int,
    seconds: float | None = None,
    batch: int = 1,
) -> list[list[float]]:
    """[len(contexts)][len(nodes)] median verify ms, measured round-robin; with `seconds`, the rounds stop
    once that much time has passed and 3 rounds are timed. At `batch` > 1 a cell is one forward of `batch`
    trees of that many nodes (BatchContextCache)."""
    started = time.perf_counter()
    if batch == 1:
        caches = [ContextCache(target, c, max(nodes)) for c in contexts]
    else:
        caches = [BatchContextCache(target, batch, c, max(nodes)) for c in contexts]
    samples = [[[] for _ in nodes] for _ in contexts]
    for round_ in range(warmup + repeats):
        if seconds is not None and round_ >= warmup + 3 and time.perf_counter() - started > seconds:
            break
        flip = round_ % 2 == 1  # alternate the order, so no size always follows the same neighbour
        for ci in reversed(range(len(contexts))) if flip else range(len(contexts)):
            for ni in reversed(range(len(nodes))) if flip else range(len(nodes)):
                ms = caches[ci].verify_ms(nodes[ni])
                if round_ >= warmup:
                    samples[ci][ni].append(ms)
    return [[statistics.median(cell) for cell in row] for row in samples]


def sweep_sizes(top_k: int, most: int, count: int = 5) -> list[int]:
    """Up to `count` expert counts from top_k to `most`, about evenly spaced on a log scale."""
    if most <= top_k:
        return [top_k]
    ratio = (most / top_k) ** (1 / (count - 1))
    return sorted({min(most, round(top_k * ratio**i)) for i in range(count)} | {top_k, most})


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs, never negative (noise cannot make an expert read free time)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var) if var else 0.0


@torch.inference_mode()
def measure_experts(target, cache: ContextCache, nodes: list[int], repeats: int) -> dict | None:
    """An MoE target's experts: the distinct experts each layer's router picked in a verify of each node count
    (untimed, on `cache`'s context), and verify ms at the largest count with the routing pinned to a growing
    number of experts (`pinned_routing`), round-robin, medians: their slope is the ms one more expert read
    costs in one layer. None for a dense target."""
    from graft.budget.experts import ExpertsTouched, pinned_routing, routers, routing_shape

    shape, model = routing_shape(getattr(target, "config", None)), getattr(target, "model", None)
    if shape is None or model is None or not routers(model):
        return None
    touched = ExpertsTouched(model)
    try:
        per_nodes = []
        for n in nodes:
            cache.verify_ms(n)
            per_nodes.append(round(touched.mean_per_layer() or 0.0, 3))
    finally:
        touched.remove()
    layers, n = len(routers(model)), max(nodes)
    sizes = sweep_sizes(shape["top_k"], min(shape["experts"], n + shape["top_k"] - 1))
    samples = {m: [] for m in sizes}
    for round_ in range(repeats + 1):  # the first round warms up
        for m in sizes if round_ % 2 == 0 else reversed(sizes):
            with pinned_routing(model, m):
                ms = cache.verify_ms(n)
            if round_:
                samples[m].append(ms)
    sweep_ms = [statistics.median(samples[m]) for m in sizes]
    return {
        **shape,
        "layers": layers,
        "experts_touched": per_nodes,
        "sweep_nodes": n,
        "sweep_experts": sizes,
        "sweep_ms": [round(ms, 4) for ms in sweep_ms],
        "expert_ms": slope([m * layers for m in sizes], sweep_ms),
    }


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
    (graft/run/conversation.py), a cost in its `other` that the measured speedup_decode includes."""
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
        if target.device.type == "cuda" and getattr(target, "timing", "host") not in ("sync", "events"):
            # timed on the host's clock alone, the loop's split is not the device's: the step's non-draft time
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
    cache = ContextCache(target, max(1, min(256, target.max_context - 40)), 32)  # a short context: what fits
    tree = chain_tree(17, 32, target.vocab_size, target.device)
    target.cache = cache.cache
    target.verify(tree, topology(tree.parents, cache.committed))  # 32 rows to move from
    path = [0, 3, 9, 20]  # root, then three nodes off their place
    path_index = torch.tensor(path, device=target.device)

    def commit_ms(keep: list[int], index) -> float:
        for layer in cache.cache.layers:  # the tree's rows back in place, as after a verify
            layer.length = cache.committed + 32
        return elapsed_ms(lambda: target.commit(cache.committed, keep, index), target)

    moved, in_place = [], []
    for _ in range(repeats + 2):
        moved.append(commit_ms(path, path_index))
        in_place.append(commit_ms([0], None))
    return max(0.0, statistics.median(moved[2:]) - statistics.median(in_place[2:]))


def engine(target) -> str:
    """The backend and how its forward runs: what makes one target's verify cost differ from another's."""
    parts = [type(target).__name__]
    lean = getattr(target, "lean", None)
    if lean is not None:  # the CPU engine: its products' kind (fast path) and which layer loop runs
        parts += [type(lean.lm_head).__name__, "native loop" if target.native is not None else "python loop"]
    if target.attention != "unknown":
        parts.append(f"attention {target.attention}")
    return ", ".join([*parts, f"compile {target.compile_mode or 'off'}"])


def identity(target, batch: int = 1) -> dict:
    """What a target's costs depend on besides tree size and context: the model (name and a hash of its
    shape), the dtype, the machine (CPU model, threads and vector ISA; or GPU name and count) and the engine;
    and at `batch` > 1 the batch (batch 1 names none, so its cache files keep their names)."""
    shape = {key: getattr(target.config, key, None) for key in SHAPE_KEYS}
    gpus = [d for d in target.devices if d.type == "cuda"]
    if gpus:
        device = f"cuda: {torch.cuda.get_device_name(target.device)} x{len(gpus)}"
    else:
        isa = torch.backends.cpu.get_cpu_capability()
        device = f"cpu: {cpu_model()} ({torch.get_num_threads()} threads, {isa})"
    return {
        "model": target.name,
        "model_hash": hashlib.sha1(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12],
        "dtype": str(target.dtype),
        "device": device,
        "engine": engine(target),
        **({"batch": batch} if batch > 1 else {}),
    }


def size_grid(max_nodes: int) -> list[int]:
    """The tree sizes to time, up to `max_nodes`: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (steps of a third to a
    half, between which the profile interpolates) and `max_nodes` itself."""
    return sorted({n for k in range(20) for n in (2**k, 3 * 2**k // 2) if n < max_nodes} | {max_nodes})


def one_sequence_verify(target, nodes: list[int], context: int, repeats: int, seconds: float | None):
    """verify_at(k, c) of one sequence's forward, measured at `nodes` x `context` when first asked: a batched
    profile's table is B trees', and the loop whose overhead CUDA times on the host decodes one sequence."""
    measured: list[CostProfile] = []

    def verify_at(k: float, c: float) -> float:
        if not measured:
            table = measure_verify(target, nodes, [context], repeats, warmup=2, seconds=seconds)
            measured.append(CostProfile("", target.name, nodes, [context], table, [0.0] * len(nodes)))
        return measured[0].verify_ms(k, c)

    return verify_at


def measure_profile(
    target, nodes: list[int], contexts: list[int], seconds: float, repeats: int = 5, batch: int = 1
) -> CostProfile:
    """A CostProfile of `target` where it runs: verify at `nodes` x `contexts` (2 warm-up rounds, medians of
    up to `repeats`, the rounds stopping after half of `seconds`), the loop's overhead, the commit move. The
    target's cache is left as it was found. At `batch` > 1 the verify table is one forward of `batch` trees;
    the loop's overhead and the commit move stay measured on one sequence (they are per sequence in a batched
    step too), and an MoE target's experts are not measured (a batch's trees route apart)."""
    started, saved = time.perf_counter(), target.cache
    verify = measure_verify(target, nodes, contexts, repeats, warmup=2, seconds=seconds / 2, batch=batch)
    # the loop's overhead is small beside the forward and grows smoothly with nodes: timed at the first two
    # sizes (the baseline's, with its gap recording, and a tree's) and the last, interpolated between
    loop_sizes = sorted({nodes[0], nodes[min(1, len(nodes) - 1)], nodes[-1]})
    if batch == 1:  # one sequence's verify, which CUDA's host-timed overhead subtracts: the table itself
        verify_at = CostProfile("", target.name, nodes, contexts, verify, [0.0] * len(nodes)).verify_ms
    else:
        verify_at = one_sequence_verify(target, loop_sizes, contexts[0], repeats, seconds / 8)
    loop_overhead, ar_draft = measure_overhead(target, loop_sizes, contexts[0], 8, verify_at)
    overhead = [interpolate(n, loop_sizes, loop_overhead) for n in nodes]
    commit_move = measure_commit_move(target, 2 * repeats)
    moe = None
    if batch == 1:
        moe = measure_experts(target, ContextCache(target, contexts[0], max(nodes)), nodes, repeats)
    target.cache = saved
    return CostProfile(
        **identity(target, batch),
        nodes=nodes,
        contexts=contexts,
        verify_table_ms=verify,
        overhead_table_ms=overhead,
        commit_move_ms=commit_move,
        draft_step_ms={AR: ar_draft},
        moe=moe or {},
        meta={
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "repeats": repeats,
            "warmup": 2,
            "seconds": round(time.perf_counter() - started, 1),
        },
    )


def cache_dir() -> Path:
    """$GRAFT_COST_PROFILES, else cost_profiles/ in the project's cache ($GRAFT_CACHE, default ~/.cache/graft)."""
    from graft.hub import cache_root

    folder = os.environ.get("GRAFT_COST_PROFILES")
    return Path(folder).expanduser() if folder else cache_root() / "cost_profiles"


def cache_path(ident: dict) -> Path:
    digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    batch = f"-b{ident['batch']}" if "batch" in ident else ""  # a batched profile's file says its batch
    return cache_dir() / f"{ident['model']}{batch}-{digest}.json"


def check_fits(target, max_nodes: int) -> None:
    """Before anything is measured: a tree of `max_nodes` nodes (the method's total_tokens) must fit in the
    target's context after at least one cached position and the 8 spare ones the measurement keeps; one line
    naming the value and the allowed range, instead of an empty prefill deep in the measurement."""
    from graft.schema import ConfigError

    room = target.max_context - 9  # the most nodes a context of max_context positions leaves room for
    if room < 1:
        raise ConfigError(
            f"model.max_context={target.max_context} is too short to measure a cost profile of {target.name} "
            f"(method.cost_profile=auto); allowed: model.max_context >= {max_nodes + 9} for a budget of {max_nodes}"
        )
    if not 1 <= max_nodes <= room:
        raise ConfigError(
            f"method.total_tokens={max_nodes} does not fit the context of {target.name} "
            f"(model.max_context={target.max_context}) with room to measure its costs; allowed: 1..{room}"
        )


def calibrated_profile(target, max_nodes: int, seconds: float = CALIBRATION_SECONDS, batch: int = 1) -> CostProfile:
    """This target's profile on this machine up to `max_nodes` nodes, at `batch` sequences a verify forward
    (run.batch_size): from the cache when one there covers them, else measured now (a few seconds to `seconds`
    and more on a slow machine) and cached; each batch size in a file of its own."""
    check_fits(target, max_nodes)
    path = cache_path(identity(target, batch))
    if path.is_file():
        try:
            cached = CostProfile.load(path)
        except ValueError:  # a torn cache file is measured again
            cached = None
        if cached is not None and max(cached.nodes) >= max_nodes and cached.batch == batch:
            log.info("cost profile of %s on this machine: %s", target.name, path)
            return cached
    longest = target.max_context - max_nodes - 8  # a tree must fit after its context
    contexts = sorted({min(c, longest) for c in CALIBRATION_CONTEXTS})
    profile = measure_profile(target, size_grid(max_nodes), contexts, seconds, batch=batch)
    profile.meta["calibrated"] = "method.cost_profile=auto"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: a concurrent run reads no half
    profile.save(partial)
    os.replace(partial, path)
    log.info(
        "cost profile of %s measured on %s in %s s (up to %d nodes, contexts %s, batch %d): %s",
        target.name,
        profile.device,
        profile.meta["seconds"],
        max_nodes,
        contexts,
        batch,
        path,
    )
    return profile
