"""Device check: what the harness does on a bare single-GPU node, in one JSON file, within a time budget.

    python scripts/gpu_check.py --out $OUT/gpu_check.json              # on the GPU node (scripts/device_check.sh)
    python scripts/gpu_check.py --device cpu --quick --out /tmp/q.json   # the same code at tiny shapes (its test)

Parts (`--parts 1,2,...`; each timed):
1. environment: device, driver, CUDA, library versions, memory, which SDPA kernels run (with and without a mask);
2. lossless: every configs/method/*.yaml against the autoregressive baseline on the tiny random models, in
   float32 and bfloat16 (a divergence records whether the baseline's top-2 gap there is a float tie);
3. host syncs per decode step of ar, eagle3, pruned and graft, with and without fixed-size trees
   (torch.cuda.set_sync_debug_mode("warn"); CUDA only);
4. a LLaMA-3.1-8B-shaped target with an EAGLE-3-shaped head: verify time per tree size and context, the
   loop's overhead per step, short ar / eagle3 / graft decode loops, the head's extend peak memory;
5. a few Qwen3-235B-A22B-shaped MoE layers: verify time and experts touched per tree size;
6. a 235B-shaped SpecForge EAGLE-3 head checkpoint (head_dim 128 != hidden / heads) loads and runs;
7. hardware.compile (torch.compile over static caches; CUDA graphs with reduce-overhead): ar, eagle3 and graft
   against the eager baseline on tiny_llama, and an 8B-shaped slice's verify time, eager against compiled.

All weights are random (the node has no network): acceptance and tau mean nothing; timings, memory and
token equality are what count. The JSON is rewritten after every part and inside the long ones, so a run
cut short (a timeout, an out-of-memory kill) still reports; a failing part records its error and the
traceback's last lines, and the next part runs. `--budget-s` is a soft limit: parts that would start after
it are skipped, and the long parts stop early, saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

PART_NAMES = {
    1: "environment",
    2: "lossless",
    3: "host_syncs",
    4: "llama8b",
    5: "moe235b_layers",
    6: "head235b",
    7: "compiled",
}
RANDOM_NOTE = "random weights: acceptance and tau are meaningless; only timings, memory and shapes count"


def published_shape(model: str, **extra) -> dict:
    """A model config's declared `shape` (configs/model/<model>.yaml: the published config.json fields the
    memory plan reads) as transformers config fields, plus `extra`. head_dim is left to the config class when
    it is hidden / heads, so that the tiny variants below, which shrink hidden and heads, keep it consistent."""
    import yaml

    shape = yaml.safe_load((ROOT / "configs" / "model" / f"{model}.yaml").read_text())["shape"]
    shape = {k: v for k, v in shape.items() if k != "model_type"}
    if shape.get("head_dim") == shape["hidden_size"] // shape["num_attention_heads"]:
        del shape["head_dim"]
    return {**shape, **extra}


# Published shapes. The 8B and 235B targets are only ever built in part.
LLAMA31_8B = published_shape("llama31_8b", rms_norm_eps=1e-5)
QWEN3_235B = published_shape("qwen3_235b", rms_norm_eps=1e-6)
# SpecForge's configs/qwen3-235B-A22B-eagle3.json (the layout of lmsys/Qwen3-235B-A22B-EAGLE3)
SPECFORGE_235B_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 46, 90], "use_aux_hidden_state": True},
    "draft_vocab_size": 32000,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 24576,
    "max_position_embeddings": 40960,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 1,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "target_hidden_size": 4096,
}


@dataclass(frozen=True)
class Plan:
    """Sizes of every part: FULL on the GPU node, QUICK at tiny shapes (the CPU test)."""

    lossless_models: tuple[str, ...] = ("tiny_llama", "tiny_qwen3", "tiny_qwen3_moe")
    lossless_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    lossless_methods: tuple[str, ...] | None = None  # None: every configs/method/*.yaml
    lossless_prompts: int = 2
    lossless_tokens: int = 24
    lossless_share_s: float = 150.0  # part 2 starts no new model after this long: the rest of the budget is the others'
    sync_tokens: tuple[int, int] = (8, 24)  # two generation lengths: their difference excludes the prefill's syncs
    dense_arch: dict = field(default_factory=lambda: dict(LLAMA31_8B))
    dense_fallback_layers: int = 8  # when the whole model would not fit the time left or the memory
    dense_full_needs_s: float = 150.0  # time left below which part 4 builds the fallback's layers
    dense_contexts: tuple[int, ...] = (1024, 4096)
    dense_nodes: tuple[int, ...] = (1, 8, 24, 60)
    decode_context: int = 1024
    decode_tokens: int = 64
    extend_tokens: int = 8192
    draft_vocab: int = 32000
    moe_arch: dict = field(default_factory=lambda: {**QWEN3_235B, "num_hidden_layers": 4})
    moe_context: int = 1024
    moe_nodes: tuple[int, ...] = (1, 8, 24, 60, 128)
    repeats: int = 10
    warmup: int = 3
    dtype: str = "bfloat16"  # parts 4-6
    hardware: tuple[str, ...] = ()  # overrides of configs/hardware/gpu.yaml
    head235: dict = field(default_factory=lambda: dict(SPECFORGE_235B_HEAD))
    target235: dict = field(default_factory=lambda: dict(QWEN3_235B))
    compile_mode: str = "reduce-overhead"  # part 7: CUDA graphs
    compile_backend: str = "inductor"
    compile_methods: tuple[str, ...] = ("ar", "eagle3", "graft")
    compile_layers: int = 4  # of dense_arch: compile time grows with the layers, the per-layer gain does not
    compile_nodes: tuple[int, ...] = (1, 60)


FULL = Plan()
QUICK = replace(
    FULL,
    lossless_dtypes=("float32",),
    lossless_methods=("pld", "eagle3", "graft"),
    lossless_prompts=1,
    lossless_tokens=8,
    lossless_share_s=60.0,
    sync_tokens=(4, 8),
    dense_arch=dict(
        LLAMA31_8B,
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,  # EAGLE-3's default taps need three distinct layers
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    ),
    dense_fallback_layers=4,
    dense_full_needs_s=0.0,
    dense_contexts=(64, 256),
    decode_context=64,
    decode_tokens=8,
    extend_tokens=256,
    draft_vocab=128,
    moe_arch=dict(
        QWEN3_235B,
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
    ),
    moe_context=64,
    repeats=3,
    warmup=1,
    hardware=("hardware.prefill_chunk=48",),  # tiny prompts still take the chunked prefill path
    compile_mode="default",
    compile_backend="eager",  # dynamo captures the graphs; inductor's code generation would take minutes here
    compile_methods=("ar", "graft"),
    compile_layers=2,
    head235=dict(
        SPECFORGE_235B_HEAD,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
        draft_vocab_size=100,
        head_dim=32,  # != hidden / heads = 16, as in the 235B head
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        target_hidden_size=64,
    ),
    target235=dict(
        QWEN3_235B,
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
)


# --- the report ------------------------------------------------------------------------------------------


class SkipPart(Exception):
    """Raised by a part that cannot run here (no CUDA, say); the part is recorded as skipped, with the reason."""


class Interrupted(BaseException):
    """SIGTERM (the `timeout` in device_check.sh): record the part in flight, save, stop."""


def traceback_tail(err: BaseException, lines: int = 12) -> list[str]:
    return "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()[-lines:]


class Report:
    """The JSON file, rewritten after every part (and whenever a part calls save), so a run cut short still
    reports. A part that raises is recorded as failed and the next one runs."""

    def __init__(self, path: Path, budget_s: float, header: dict):
        self.path, self.budget_s = path, budget_s
        self.started = time.perf_counter()
        self.data = {
            **header,
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "budget_s": budget_s,
            "elapsed_s": 0.0,
            "finished": False,
            "parts": {},
        }

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()

    def save(self) -> None:
        """Write to a temporary file and rename it, so a kill mid-write leaves the previous complete file."""
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def skip(self, number: int, reason: str) -> None:
        self.data["parts"][str(number)] = {
            "name": PART_NAMES.get(number, str(number)),
            "status": "skipped",
            "reason": reason,
        }
        self.save()

    def run(self, number: int, fn: Callable[[dict], None]) -> None:
        """Run one part: `fn(result)` fills `result` as it goes; its status is ok, skipped or failed."""
        if self.remaining() <= 0:
            self.skip(
                number, f"budget: {self.elapsed():.0f} s of --budget-s {self.budget_s:.0f} spent before it started"
            )
            return
        record: dict = {"name": PART_NAMES.get(number, str(number)), "status": "running", "result": {}}
        self.data["parts"][str(number)] = record
        self.save()
        start = time.perf_counter()
        try:
            fn(record["result"])
            record["status"] = "ok"
        except SkipPart as why:
            record.update(status="skipped", reason=str(why))
        except Interrupted:
            record.update(status="interrupted", reason="SIGTERM (the run's time limit) during this part")
            raise
        except Exception as err:  # a failing part must not stop the others: record what broke
            record.update(status="failed", error=f"{type(err).__name__}: {err}"[:2000], traceback=traceback_tail(err))
            err.__traceback__ = None  # the frames hold the part's models: let them go before the next part
        finally:
            record["seconds"] = round(time.perf_counter() - start, 2)
            release_memory()
            self.save()
        print(f"part {number} {record['name']}: {record['status']} in {record['seconds']:.1f} s", flush=True)

    def finish(self) -> None:
        self.data["finished"] = True
        self.data["summary"] = summarize(self.data["parts"])
        self.save()


@dataclass
class Context:
    plan: Plan
    device: torch.device
    quick: bool
    report: Report

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def checkpoint(self) -> None:
        """Save what the part in flight has so far."""
        self.report.save()

    @property
    def hardware(self) -> list[str]:
        """configs/hardware/gpu.yaml on either device: the CPU quick mode runs the GPU config's code paths
        (attention kernel, chunked prefill), only on the CPU."""
        return ["hardware=gpu", f"hardware.device={self.device.type}", *self.plan.hardware]


# --- small helpers ---------------------------------------------------------------------------------------


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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
    """A transformers causal LM with random weights, built on `device` in `dtype` directly (graft/models.py
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
    scripts/bench_forward.py does). `on_tree(n, tree, topo)` runs once per size, untimed."""
    from graft.tree import topology

    target.reset(len(context) + max(nodes) + 8)
    target.prefill(context)
    committed = target.cache_len
    out = {}
    for n in nodes:
        tree = random_tree(n, target.vocab_size, target.device, seed=n)
        topo = topology(tree.parents, committed)

        def once() -> None:
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
    from graft.config import compose, validate

    return validate(compose([f"method={name}", "logger=none", "model=tiny_llama", *overrides])).method


def hardware_config(ctx: Context):
    from graft.config import compose, validate

    return validate(compose(["logger=none", *ctx.hardware])).hardware


def load_tiny(name: str, dtype: str, ctx: Context, overrides: list[str] = ()):
    from graft.config import compose, validate
    from graft.models import load_model

    cfg = validate(compose([f"model={name}", "logger=none", *ctx.hardware, f"model.dtype={dtype}", *overrides]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)  # random tiny models drift into subnormals on the CPU (tests/conftest.py)
    return model, cfg


def harness_target(model, hardware, name: str):
    """The target graft.models.load_model makes of a loaded model under `hardware`: its attention kernel, an
    HFBackend, prefill chunks, timing mode. Parts 4-5 build their models on the GPU directly (load_model
    builds random models on the CPU in float32: minutes for 8B), so they repeat these steps here."""
    from graft import models
    from graft.backends.hf import HFBackend

    if getattr(hardware, "attention", None):
        models.use_attention(model, hardware.attention)
    target = HFBackend(model, models.ByteTokenizer(), name=name)
    target.prefill_chunk = getattr(hardware, "prefill_chunk", None)
    timing = getattr(hardware, "timing", "async")
    target.sync_timing = timing == "sync" or (timing == "auto" and target.device.type == "cuda")
    return target


def builtin_prompt_ids(model, count: int) -> list[list[int]]:
    from graft.data import BUILTIN

    return [model.chat.prompt_ids([{"role": "user", "content": p.turns[0]}]) for p in BUILTIN[:count]]


def as_conversation(gen):
    from graft.runner import Conversation

    return Conversation(turns=[gen], texts=[""])


# --- part 1: environment ---------------------------------------------------------------------------------


def nvidia_smi() -> dict | None:
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return dict(zip(query.split(","), (v.strip() for v in line.splitlines()[0].split(",")))) if line else None


def sdpa_probe(device: torch.device, dtype: torch.dtype) -> dict:
    """Which SDPA kernels run here, causal without a mask (prefill) and with an additive mask (the harness's
    tree verification): the enabled flags say what torch may pick, the probe what works."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 8, 64, 64, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, 64, 64, device=device, dtype=dtype)
    out = {}
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        row = {}
        for case, kwargs in (("causal", {"is_causal": True}), ("masked", {"attn_mask": mask})):
            try:
                with sdpa_kernel(backend), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a refused kernel warns why; the probe records the outcome
                    torch.nn.functional.scaled_dot_product_attention(q, q, q, **kwargs)
                sync(device)
                row[case] = True
            except Exception:  # "no available kernel" and its kin: this kernel does not run this case here
                row[case] = False
        out[backend.name.lower()] = row
    return out


def part_environment(ctx: Context, out: dict) -> None:
    out.update(
        python=platform.python_version(),
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        packages={
            p: version_of(p) for p in ("transformers", "accelerate", "hydra-core", "omegaconf", "safetensors", "numpy")
        },
        cuda_available=torch.cuda.is_available(),
        device=str(ctx.device),
    )
    sdp = torch.backends.cuda
    out["sdpa_enabled"] = {
        "flash": sdp.flash_sdp_enabled(),
        "mem_efficient": sdp.mem_efficient_sdp_enabled(),
        "math": sdp.math_sdp_enabled(),
        "cudnn": sdp.cudnn_sdp_enabled() if hasattr(sdp, "cudnn_sdp_enabled") else None,
    }
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        free, total = torch.cuda.mem_get_info(ctx.device)
        out.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_total_gib=gib(total),
            memory_free_gib=gib(free),
            flash_attention_built=getattr(sdp, "is_flash_attention_available", lambda: None)(),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            nvidia_smi=nvidia_smi(),
        )
    out["sdpa_probe_" + ctx.plan.dtype] = sdpa_probe(ctx.device, getattr(torch, ctx.plan.dtype))


# --- part 2: losslessness of every method config ---------------------------------------------------------


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
        if time.perf_counter() - started > plan.lossless_share_s or ctx.report.remaining() <= 0:
            out["truncated"] = f"stopped after {time.perf_counter() - started:.0f} s; not checked: {pending}"
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


# --- part 3: host syncs per decode step ------------------------------------------------------------------


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


# --- part 4: an 8B-shaped dense target with an EAGLE-3-shaped head ---------------------------------------


def dense_layers(plan: Plan, device: torch.device, remaining_s: float) -> tuple[int, str | None]:
    """How many layers part 4 builds: all of them, unless the time left or the free memory is short."""
    layers = plan.dense_arch["num_hidden_layers"]
    if remaining_s < plan.dense_full_needs_s:
        return plan.dense_fallback_layers, f"{remaining_s:.0f} s of the budget left (< {plan.dense_full_needs_s:.0f} s)"
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
    """A random EAGLE-3 head shaped for `target` (graft.eagle.checkpoint.random_head, draft vocabulary
    plan.draft_vocab), saved in SpecForge's layout, so methods load it as `method.head=<directory>`."""
    from graft.eagle.checkpoint import random_head, save_head

    head = random_head(target, "eagle3", draft_vocab=plan.draft_vocab)
    save_head(head, directory, layout="specforge")
    info = {"parameters_m": round(parameter_count(head) / 1e6, 1), "layer_ids": head.cfg.layer_ids}
    del head
    return info


def decode_loops(ctx: Context, target, head_dir: Path, out: dict) -> dict:
    """Short ar / eagle3 / graft loops on a random prompt of plan.decode_context tokens; the verify forwards
    are timed inside the loop, the rest of each step is the harness's overhead."""
    from baselines.autoregressive import Autoregressive
    from graft.decode import generate
    from graft.registry import build_drafter

    plan = ctx.plan
    drafters = {"ar": Autoregressive(target)}
    for name in ("eagle3", "graft"):
        drafters[name] = build_drafter(method_config_of(name, [f"method.head={head_dir}"]), target)
    prompt = random_ids(plan.decode_context, target.vocab_size, seed=1)
    decode = out["decode"] = {"note": RANDOM_NOTE, "prompt_tokens": len(prompt), "max_new_tokens": plan.decode_tokens}
    default_sync = target.sync_timing
    # hardware.timing: sync (the default on CUDA) times each phase at the price of a sync per phase; async is
    # the loop as it runs untimed. Both, so the price shows.
    for timing in ("sync", "async"):
        target.sync_timing = timing == "sync"
        rows = decode[f"timing_{timing}"] = {}
        for name, drafter in drafters.items():
            if ctx.report.remaining() <= 0:
                decode["truncated"] = f"budget spent before {name} (timing {timing})"
                break
            generate(target, drafter, prompt, min(8, plan.decode_tokens), set())  # warm-up, untimed
            with timed_verify(target) as verify_ms:
                gen = generate(target, drafter, prompt, plan.decode_tokens, set())
            rows[name] = decode_record(gen, verify_ms)
            ctx.checkpoint()
    target.sync_timing = default_sync
    return drafters


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
    layers, why = dense_layers(plan, ctx.device, ctx.report.remaining())
    arch = {**plan.dense_arch, "num_hidden_layers": layers}
    out.update(arch=arch, dtype=plan.dtype, note=RANDOM_NOTE)
    if why:
        out["reduced_layers"] = f"{layers} of {plan.dense_arch['num_hidden_layers']} layers: {why}"
    start = time.perf_counter()
    model = random_causal_lm("llama", arch, ctx.device, dtype)
    out.update(build_s=round(time.perf_counter() - start, 1), parameters_b=round(parameter_count(model) / 1e9, 3))
    if ctx.cuda:
        out["weights_gib"] = gib(torch.cuda.memory_allocated(ctx.device))
    target = harness_target(model, hardware_config(ctx), "llama8b_shaped")
    out.update(attention=getattr(target, "attention", None), prefill_chunk=getattr(target, "prefill_chunk", None))
    target.max_context = max(plan.extend_tokens, max(plan.dense_contexts)) + 1024
    out["verify"] = {}
    for context_len in plan.dense_contexts:
        context = random_ids(context_len, target.vocab_size, seed=context_len)
        out["verify"][str(context_len)] = verify_times(target, context, plan.dense_nodes, plan)
        ctx.checkpoint()
    with tempfile.TemporaryDirectory(prefix="gpu_check_head_") as tmp:
        out["head"] = save_random_head(target, plan, Path(tmp) / "head")
        ctx.checkpoint()
        drafters = decode_loops(ctx, target, Path(tmp) / "head", out)
    if ctx.report.remaining() > 0:
        out["extend"] = extend_peak(ctx, target, drafters["eagle3"])
    else:
        out["extend"] = {"skipped": "budget spent"}


# --- part 5: Qwen3-235B-shaped MoE layers ----------------------------------------------------------------


class ExpertsTouched:
    """Counts the distinct experts each MoE layer's router picks for the tokens of one forward (recomputed
    from the router's weight on its input, which does not depend on transformers' router internals)."""

    def __init__(self, model, top_k: int):
        self.top_k, self.counts, self.hooks = top_k, [], []
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "weight"):
                self.hooks.append(gate.register_forward_pre_hook(self._hook))

    def _hook(self, gate, args) -> None:
        hidden = args[0].reshape(-1, gate.weight.shape[-1])
        chosen = torch.topk(hidden @ gate.weight.T.to(hidden.dtype), self.top_k, dim=-1).indices
        self.counts.append(int(chosen.unique().numel()))

    def take(self) -> list[int]:
        counts, self.counts = self.counts, []
        return counts

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def part_moe_layers(ctx: Context, out: dict) -> None:
    plan, arch = ctx.plan, ctx.plan.moe_arch
    out.update(arch=arch, dtype=plan.dtype, context=plan.moe_context, note=RANDOM_NOTE)
    start = time.perf_counter()
    model = random_causal_lm("qwen3_moe", arch, ctx.device, getattr(torch, plan.dtype))
    out.update(build_s=round(time.perf_counter() - start, 1), parameters_b=round(parameter_count(model) / 1e9, 3))
    out["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    if ctx.cuda:
        out["weights_gib"] = gib(torch.cuda.memory_allocated(ctx.device))
    target = harness_target(model, hardware_config(ctx), "qwen3_235b_layers")
    out["attention"] = getattr(target, "attention", None)
    touched = ExpertsTouched(model, arch["num_experts_per_tok"])
    experts: dict[str, float] = {}

    def count_experts(n, tree, topo) -> None:
        touched.take()
        target.verify(tree, topo)
        counts = touched.take()
        experts[str(n)] = rounded(statistics.mean(counts), 1) if counts else None

    context = random_ids(plan.moe_context, target.vocab_size, seed=3)
    try:
        out["verify"] = verify_times(target, context, plan.moe_nodes, plan, on_tree=count_experts)
    finally:
        touched.remove()
    for n, row in out["verify"].items():
        row["experts_touched_per_layer"] = experts.get(n)
    out["experts_per_layer"] = arch["num_experts"]


# --- part 6: a 235B-shaped SpecForge EAGLE-3 head loads --------------------------------------------------


def specforge_head_state(raw: dict, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Random weights named and shaped as a SpecForge EAGLE-3 checkpoint of config `raw`, derived from the
    config alone (not from graft's head, so a shape bug there cannot hide behind its own checkpoint)."""
    h, d, i = raw["hidden_size"], raw["head_dim"], raw["intermediate_size"]
    q, kv, feats = raw["num_attention_heads"] * d, raw["num_key_value_heads"] * d, 3 * raw["target_hidden_size"]
    shapes = {
        "fc.weight": (h, feats),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "lm_head.weight": (raw["draft_vocab_size"], h),
    }
    state = {k: torch.empty(s, dtype=dtype, device=device).normal_(0, 0.02).cpu() for k, s in shapes.items()}
    for norm in ("midlayer.hidden_norm", "midlayer.input_layernorm", "midlayer.post_attention_layernorm", "norm"):
        state[f"{norm}.weight"] = torch.ones(h, dtype=dtype)
    draft = raw["draft_vocab_size"]
    state["d2t"] = torch.arange(draft, dtype=torch.long)  # draft id i -> target id 2i
    t2d = torch.zeros(raw["vocab_size"], dtype=torch.bool)
    t2d[2 * torch.arange(draft)] = True
    state["t2d"] = t2d
    return state


@dataclass
class TargetStub:
    """What load_head reads of a target: its config, LM head, device and dtype (no 235B weights needed)."""

    config: object
    device: torch.device
    dtype: torch.dtype
    lm_head: object = None


def part_head235(ctx: Context, out: dict) -> None:
    from safetensors.torch import save_file
    from transformers import Qwen3MoeConfig

    from graft.eagle.checkpoint import load_head
    from graft.methods.eagle3 import extend

    raw, dtype = ctx.plan.head235, getattr(torch, ctx.plan.dtype)
    target = TargetStub(Qwen3MoeConfig(**ctx.plan.target235), ctx.device, dtype)
    expected_layers = [i + 1 for i in raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    out.update(
        config={
            k: raw[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "draft_vocab_size",
            )
        },
        hidden_over_heads=raw["hidden_size"] // raw["num_attention_heads"],
    )
    with tempfile.TemporaryDirectory(prefix="gpu_check_head235_") as tmp:
        start = time.perf_counter()
        state = specforge_head_state(raw, dtype, ctx.device)
        out["parameters_m"] = round(sum(t.numel() for t in state.values() if t.is_floating_point()) / 1e6, 1)
        (Path(tmp) / "config.json").write_text(json.dumps(raw, indent=2))
        save_file(state, str(Path(tmp) / "model.safetensors"))
        del state
        out["write_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        try:
            head = load_head(tmp, target)
        except Exception as err:  # the finding itself: keep the loader's message in the result as well
            out["load_error"] = f"{type(err).__name__}: {err}"[:2000]
            raise
        out["load_s"] = round(time.perf_counter() - start, 1)
    cfg = head.cfg
    out.update(head_dim=cfg.head_dim, layer_ids=cfg.layer_ids, expected_layer_ids=expected_layers, kind=cfg.kind)
    assert cfg.head_dim == raw["head_dim"], f"loaded head_dim {cfg.head_dim}, config says {raw['head_dim']}"
    assert cfg.layer_ids == expected_layers, f"layer ids {cfg.layer_ids}, SpecForge's aux ids + 1 are {expected_layers}"
    # one extend over a few positions: the loaded head runs with the target's feature width and vocabulary
    n, h = 4, raw["hidden_size"]
    embeds = torch.randn(n, h, device=ctx.device, dtype=dtype)
    features = torch.randn(n, 3 * raw["target_hidden_size"], device=ctx.device, dtype=dtype)
    with torch.inference_mode():
        hidden = extend(head, head.new_cache(16), embeds, features)
        logp, d2t = head.log_probs(hidden)
    out.update(extend_out=list(hidden.shape), log_probs=list(logp.shape), uses_d2t=d2t is not None)
    assert list(logp.shape) == [n, raw["draft_vocab_size"]], f"log_probs {list(logp.shape)}"


# --- the run ---------------------------------------------------------------------------------------------

# --- part 7: hardware.compile ------------------------------------------------------------------------------


def part_compiled(ctx: Context, out: dict) -> None:
    """The compiled path against eager: tokens on tiny_llama, then verify time on an 8B-shaped slice."""
    from baselines.autoregressive import Autoregressive
    from graft.registry import build_drafter

    plan = ctx.plan
    overrides = [f"hardware.compile={plan.compile_mode}", f"hardware.compile_backend={plan.compile_backend}"]
    out.update(mode=plan.compile_mode, backend=plan.compile_backend, dtype=plan.dtype, methods={})
    eager, _ = load_tiny("tiny_llama", plan.dtype, ctx)
    prompts = builtin_prompt_ids(eager, plan.lossless_prompts)
    bases = baseline_generations(eager, prompts, plan)
    del eager
    model, cfg = load_tiny("tiny_llama", plan.dtype, ctx, overrides)
    target = model.target
    for method in plan.compile_methods:

        def make_drafter(method=method):
            return Autoregressive(target) if method == "ar" else build_drafter(method_config_of(method), target)

        out["methods"][method] = lossless_row(model, cfg, make_drafter, prompts, bases, plan)
        ctx.checkpoint()
    out["totals"] = lossless_totals({"tiny_llama": {plan.dtype: out["methods"]}})
    del model, target
    release_memory()
    if ctx.report.remaining() <= 0:
        out["verify"] = {"skipped": "budget spent"}
        return
    arch = {**plan.dense_arch, "num_hidden_layers": plan.compile_layers}
    out["arch"] = arch
    slice_model = random_causal_lm("llama", arch, ctx.device, getattr(torch, plan.dtype))
    hardware = hardware_config(ctx)
    context = random_ids(plan.decode_context, arch["vocab_size"], seed=7)
    out["verify"] = {}
    for name, mode in (("eager", None), ("compiled", plan.compile_mode)):
        target = harness_target(slice_model, hardware, f"llama8b_slice_{name}")
        target.static_trees, target.compile_mode, target.compile_backend = True, mode, plan.compile_backend
        target.max_context = plan.decode_context + max(plan.compile_nodes) + 64
        out["verify"][name] = verify_times(target, context, plan.compile_nodes, plan)
        ctx.checkpoint()
    out["verify"]["eager_over_compiled"] = {
        n: rounded(out["verify"]["eager"][n]["median_ms"] / out["verify"]["compiled"][n]["median_ms"])
        for n in out["verify"]["eager"]
    }


PARTS: dict[int, Callable[[Context, dict], None]] = {
    1: part_environment,
    2: part_lossless,
    3: part_host_syncs,
    4: part_llama8b,
    5: part_moe_layers,
    6: part_head235,
    7: part_compiled,
}


def summarize(parts: dict) -> dict:
    """The headline numbers of every part, for reading the JSON's end first."""
    summary = {"status": {k: p["status"] for k, p in parts.items()}}
    get = lambda k: parts.get(k, {}).get("result", {})  # noqa: E731
    by_timing = lambda rows, key: {  # noqa: E731
        timing: {method: row.get(key) for method, row in methods.items()}
        for timing, methods in rows.items()
        if timing.startswith("timing_")
    }
    if "totals" in get("2"):
        summary["lossless"] = get("2")["totals"]
    if get("3"):
        summary["syncs_per_step"] = by_timing(get("3"), "syncs_per_step")
    if get("4").get("verify"):
        verify = get("4")["verify"]
        summary["llama8b_verify_median_ms"] = {
            c: {n: r["median_ms"] for n, r in rows.items()} for c, rows in verify.items()
        }
        summary["llama8b_overhead_ms_per_step"] = by_timing(get("4").get("decode", {}), "overhead_ms_per_step")
        summary["llama8b_extend_peak_gib"] = get("4").get("extend", {}).get("head_extend_peak_gib")
    if get("5").get("verify"):
        summary["moe_verify_median_ms"] = {n: r["median_ms"] for n, r in get("5")["verify"].items()}
    if "6" in parts:
        summary["head235_loads"] = parts["6"]["status"] == "ok"
    failed = {
        k: p.get("error") or p.get("reason") for k, p in parts.items() if p["status"] in ("failed", "interrupted")
    }
    if failed:
        summary["failed"] = failed
    return summary


def parse_parts(text: str) -> list[int]:
    parts = sorted({int(p) for p in text.split(",") if p.strip()})
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown parts {unknown}; parts are {sorted(PARTS)}")
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/gpu_check.json")
    parser.add_argument("--parts", type=parse_parts, default=sorted(PARTS), help="e.g. 1,2,6 (default: all)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="soft total time limit; later parts are skipped")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few methods (for the CPU test)")
    args = parser.parse_args(argv)

    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the node: fail fast instead of retrying the Hub
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device; use --device cpu --quick")
    device = torch.device(args.device)
    if args.quick and device.type == "cpu":
        # tiny shapes gain nothing from threads, and on a busy machine their spin-waits cost 5-10x (measured: 54 s
        # against 8 s for the whole quick run with 2 threads on 2 loaded cores)
        torch.set_num_threads(1)
    header = {
        "script": "scripts/gpu_check.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "device": str(device),
        "quick": args.quick,
    }
    report = Report(Path(args.out), args.budget_s, header)
    ctx = Context(plan=QUICK if args.quick else FULL, device=device, quick=args.quick, report=report)

    def on_term(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    try:
        for number, part in PARTS.items():
            if number in args.parts:
                report.run(number, lambda result, part=part: part(ctx, result))
            else:
                report.skip(number, "not selected (--parts)")
    except Interrupted:
        report.data["interrupted"] = True
        for number in PARTS:
            if str(number) not in report.data["parts"]:
                report.skip(number, "SIGTERM (the run's time limit) before it started")
    report.finish()
    print(json.dumps(report.data["summary"], indent=1))
    print(f"wrote {args.out} in {report.elapsed():.1f} s")
    return 1 if "failed" in report.data["summary"] else 0  # every part ok or skipped: 0


if __name__ == "__main__":
    sys.exit(main())
