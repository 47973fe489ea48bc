"""What the device check's parts share: device timing (CUDA events or the host's clock), random models and
trees, verification and decode-loop timings, and the harness's configs and tiny models."""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import statistics
import time
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from graft.gpu_check.plan import Plan

if TYPE_CHECKING:
    from graft.gpu_check.report import Context


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def ms_summary(times_ms: list[float]) -> dict:
    return {"median_ms": rounded(statistics.median(times_ms)), "min_ms": rounded(min(times_ms)), "n": len(times_ms)}


def gib(num_bytes: float) -> float:
    return round(num_bytes / 2**30, 3)


class Clock:
    """Marks on the device's timeline: CUDA events on the GPU (recording one adds no host sync), the host's
    clock on the CPU. `ms(a, b)` needs the marks complete: call it after a sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3


def time_ms(fn: Callable[[], None], device: torch.device, repeats: int, warmup: int) -> list[float]:
    """Device time of each of `repeats` calls of `fn`, after `warmup` untimed ones."""
    clock = Clock(device)
    for _ in range(warmup):
        fn()
    marks = []
    for _ in range(repeats):
        start = clock.mark()
        fn()
        marks.append((start, clock.mark()))
    sync(device)
    return [clock.ms(a, b) for a, b in marks]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def random_causal_lm(architecture: str, arch: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A transformers causal LM with random weights, built on `device` in `dtype` directly (graft/load/models.py
    builds random models on the CPU in float32 first, which for 8B parameters takes minutes and 32 GB)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    }[architecture]
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        model = model_cls(config_cls(**arch))
    return model.eval()


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def random_ids(count: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def bushy_parents(num_nodes: int, branching: int = 4) -> list[int]:
    """Parents of a tree filled breadth first, `branching` children per node: shaped like an EAGLE draft."""
    return [-1] + [(i - 1) // branching for i in range(1, num_nodes)]


def random_tree(num_nodes: int, vocab: int, device: torch.device, seed: int):
    from graft.tree import DraftTree, NodeSource

    tokens = torch.tensor(random_ids(num_nodes, vocab, seed), dtype=torch.long, device=device)
    parents = torch.tensor(bushy_parents(num_nodes), dtype=torch.long, device=device)
    return DraftTree.build(tokens, parents, NodeSource.TEST)


def verify_times(target, context: list[int], nodes: tuple[int, ...], plan: Plan, on_tree=None) -> dict[str, dict]:
    """Median device time of one verification forward per tree size, on `context` committed tokens. The
    cache is rolled back after each forward, so every repeat sees the same context (as
    graft/costmodel/forward.py does). `on_tree(n, tree, topo)` runs once per size, untimed."""
    from graft.tree import topology

    target.reset(len(context) + max(nodes) + 8)
    target.prefill(context)
    committed = target.cache_len
    out = {}
    for n in nodes:
        tree = random_tree(n, target.vocab_size, target.device, seed=n)
        topo = topology(tree.parents, committed)

        def once(tree=tree, topo=topo) -> None:
            target.verify(tree, topo)  # the backend builds the mask: part of a verification's cost
            target.cache.keep(committed, None, 0)

        if on_tree is not None:
            on_tree(n, tree, topo)
            target.cache.keep(committed, None, 0)
        times = time_ms(once, target.device, plan.repeats, plan.warmup)
        out[str(n)] = {**ms_summary(times), "ms_per_node": rounded(statistics.median(times) / n)}
    return out


@contextlib.contextmanager
def timed_verify(target) -> Iterator[list[float]]:
    """Times every target.verify call in the block on the device's timeline; the list fills on exit."""
    clock, marks, original = Clock(target.device), [], target.verify

    def verify(*args, **kwargs):
        start = clock.mark()
        result = original(*args, **kwargs)
        marks.append((start, clock.mark()))
        return result

    target.verify = verify  # an instance attribute shadows the method for this block only
    times: list[float] = []
    try:
        yield times
    finally:
        del target.verify
        sync(target.device)
        times.extend(clock.ms(a, b) for a, b in marks)


def decode_record(gen, verify_ms: list[float]) -> dict:
    """One decode loop's per-step costs: the loop's time per step, the verification forwards' device time
    per step, and the rest (drafting, masks, acceptance, commit, Python): the harness's overhead."""
    steps = max(gen.steps, 1)
    loop_ms, forward_ms = gen.decode_s * 1e3, sum(verify_ms)
    return {
        "new_tokens": len(gen.new_tokens),
        "steps": gen.steps,
        "tau": rounded(gen.tau),
        "mean_nodes": rounded(statistics.mean(gen.nodes)) if gen.nodes else None,
        "step_ms": rounded(loop_ms / steps),
        "verify_ms_per_step": rounded(forward_ms / steps),
        "overhead_ms_per_step": rounded((loop_ms - forward_ms) / steps),
        "draft_ms_per_step": rounded(sum(gen.draft_s) * 1e3 / steps),  # host time; on CUDA partly queued work
        "tokens_per_s": rounded(len(gen.new_tokens) / gen.decode_s if gen.decode_s else float("nan"), 2),
    }


def per_step_rate(short: tuple[int, int], long: tuple[int, int]) -> float | None:
    """(events, steps) of a short and a longer generation -> events per step, the prefill's and the
    teardown's events cancelled by the difference."""
    (events_a, steps_a), (events_b, steps_b) = short, long
    return None if steps_b <= steps_a else rounded((events_b - events_a) / (steps_b - steps_a), 2)


def method_config_of(name: str, overrides: list[str] = ()):
    """The method `python run.py method=<name> ...` runs, composed by Hydra and validated by the harness."""
    from graft.config.experiment import compose, validate

    return validate(compose([f"method={name}", "logger=none", "model=tiny_llama", *overrides])).method


def hardware_config(ctx: Context):
    from graft.config.experiment import compose, validate

    return validate(compose(["logger=none", *ctx.hardware])).hardware


def load_tiny(name: str, dtype: str, ctx: Context, overrides: list[str] = ()):
    from graft.config.experiment import compose, validate
    from graft.load.models import load_model

    cfg = validate(compose([f"model={name}", "logger=none", *ctx.hardware, f"model.dtype={dtype}", *overrides]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)  # random tiny models drift into subnormals on the CPU (tests/conftest.py)
    return model, cfg


def harness_target(model, hardware, name: str):
    """The target graft.load.models.load_model makes of a loaded model under `hardware`: its attention kernel, an
    HFBackend, prefill chunks, timing mode. Parts 4-5 build their models on the GPU directly (load_model
    builds random models on the CPU in float32: minutes for 8B), so they repeat these steps here."""
    from graft.backends.hf import HFBackend
    from graft.load import models

    if getattr(hardware, "attention", None):
        models.use_attention(model, hardware.attention)
    target = HFBackend(model, models.ByteTokenizer(), name=name)
    target.prefill_chunk = getattr(hardware, "prefill_chunk", None)
    target.fixed_size_trees = bool(getattr(hardware, "fixed_size_trees", False))  # fixed-size trees: the GPU default
    # as graft/load/models.py: CUDA events at the phase boundaries on a GPU (hardware.timing=auto, the GPU default)
    timing = getattr(hardware, "timing", "auto")
    target.timing = {"sync": "sync", "async": "host"}.get(timing, "events" if target.device.type == "cuda" else "host")
    return target


def weight_bytes(model) -> int:
    """Bytes of a model's parameters in their dtype (a tied matrix once): what one decode step reads."""
    seen = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def hbm_bound(model, device: torch.device) -> dict:
    """The decode step's bound on this GPU: weight bytes / the table's HBM bandwidth (graft/costmodel/bound.py);
    no bound on a CPU or an unknown GPU."""
    from graft.costmodel.bound import bandwidth_gbs, bound_ms

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    gbs, num_bytes = bandwidth_gbs(name), weight_bytes(model)
    return {
        "weight_bytes": num_bytes,
        "gpu": name,
        "hbm_gbs": gbs,
        "hbm_bound_ms": rounded(bound_ms(num_bytes, gbs), 4) if gbs else None,
        "source": "graft/costmodel/bound.py HBM_BANDWIDTH_GBS (NVIDIA datasheets)" if gbs else "no HBM table entry",
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return rounded(a / b) if a is not None and b else None


def builtin_prompt_ids(model, count: int) -> list[list[int]]:
    from graft.data.loading import BUILTIN

    return [model.chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in BUILTIN[:count]]


def as_conversation(gen):
    from graft.run.conversation import Conversation

    return Conversation(turns=[gen], texts=[""])
