"""The typed schema of the Hydra config: one dataclass per section, each refusing a bad value as it is built
with a message that names the key and what is allowed. The YAML files under `graft/configs/` (`configs/` in the
repository links there) mirror them one group per section; a method section holds `name`, its drafter and the keys
of the parts it composes (graft/registry.py routes and checks them), and a method YAML states only what differs
from the dataclass defaults or from the method it derives from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from graft.config.shapes import check_declared_shape
from graft.registry import MethodConfig
from graft.schema import require


@dataclass
class RunConfig:
    num_prompts: int | None = None  # first N prompts of the dataset (None: all)
    max_new_tokens: int = 64  # per turn
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    out_dir: str = "outputs/run"
    warmup: bool = True  # one untimed generation per decoder before the timed prompts
    warmup_tokens: int = 16
    # a divergence is a float tie when the baseline's top-2 gap <= this many ulps of its top logit, in the
    # logits' dtype; None: 16 for float32, 4 for bfloat16 / float16 (graft/run/lossless.py: float_tie says why)
    float_tie_ulps: int | None = None
    progress: bool = True
    score: bool = False  # GSM8K exact match / HumanEval pass@1 where the dataset has references
    skip_memory_check: bool = (
        False  # load even when graft/plan/memory.py's plan says this machine cannot hold the model
    )
    # the whole interleaved comparison R times (every prompt, every method, again); summary.json's `repeats`
    # gives each headline ratio's mean, min and max over them: the machine's noise between runs
    repeats: int = 1
    # sequences decoded together (graft/batch.py): one verify forward per step for all of them, a finished one's
    # slot taken by the next prompt; 1: one sequence at a time, as every anchor of the field measures
    batch_size: int = 1

    def __post_init__(self):
        require(self.max_new_tokens >= 1, "run.max_new_tokens", self.max_new_tokens, "an integer >= 1")
        require(self.temperature >= 0, "run.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        require(0 < self.top_p <= 1, "run.top_p", self.top_p, "a number in (0, 1]")
        require(
            self.num_prompts is None or self.num_prompts >= 1,
            "run.num_prompts",
            self.num_prompts,
            "null or an integer >= 1",
        )
        require(self.repeats >= 1, "run.repeats", self.repeats, "an integer >= 1 (1: the comparison once)")
        require(self.batch_size >= 1, "run.batch_size", self.batch_size, "an integer >= 1 (1: one sequence at a time)")


@dataclass
class ModelConfig:
    name: str
    source: Literal["embedded", "pretrained", "random"]
    path: str | None = None  # pretrained: a Hub id or a local directory
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device_map: str | None = None  # e.g. "auto" to shard a large model over GPUs
    attn_implementation: str = "sdpa"
    chat_template: str | None = None  # Jinja template for tokenizers that have none (Vicuna v1.1)
    system_prompt: str | None = None
    max_context: int | None = None  # defaults to the config's max_position_embeddings
    stop_tokens: list[str] = field(default_factory=list)  # extra stop tokens beyond the tokenizer's eos
    architecture: Literal["llama", "qwen2", "qwen3", "qwen3_moe"] | None = None  # random: which HF class
    arch_config: dict = field(default_factory=dict)  # random: config fields
    seed: int = 0  # random: weight seed
    draft_head: str | None = None  # the model's published EAGLE head (Hub id or local directory)
    block_drafter: str | None = None  # the model's DFlash-style block drafter (Hub id or local directory)
    hardware_hint: str = ""  # what it needs, for people choosing a node
    # GPUs a sharded run uses: "auto", the smallest count whose per-GPU memory plan fits (graft/plan/placement.py),
    # settled at start-up from the GPUs' free memory; a number is honoured. `${gpus_needed:}`
    # (graft/plan/hardware.py) resolves it to a number before the run (a scheduler's request): the plan's count on
    # H200s unless told another size.
    num_gpus: int | Literal["auto"] = "auto"
    # The published config.json sizes (graft/config/shapes.SHAPE_KEYS) that the memory plan reads before loading;
    # a local model.path's config.json and a random model's arch_config take its place.
    shape: dict | None = None
    fp8_path: str | None = None  # the official FP8 variant (Hub id), for runs that opt into it with model.path=

    def __post_init__(self):
        if self.shape is not None:
            check_declared_shape(self.shape)
        require(
            self.num_gpus == "auto" or self.num_gpus >= 1, "model.num_gpus", self.num_gpus, "auto or an integer >= 1"
        )


@dataclass
class DatasetConfig:
    name: str
    source: Literal[
        "builtin", "question_jsonl", "eagle", "mt_bench", "humaneval", "gsm8k", "longbench", "pg19", "long_synthetic"
    ] = "builtin"
    path: str | None = None  # a local file or folder; overrides paths.data_root and the Hub
    local_name: str | None = None  # where the file sits under paths.data_root (the ../shared/data layout)
    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "test"
    num_prompts: int | None = None
    categories: list[str] | None = None
    per_category: int | None = None  # the first N prompts of each category (a balanced subset)
    min_prompt_tokens: int | None = None  # first turn, chat template included, target's tokenizer
    max_prompt_tokens: int | None = None
    prompt_template: str | None = None  # how a record becomes the first user turn, e.g. "{question}"
    subsets: list[str] | None = None  # longbench
    lengths: list[int] = field(default_factory=lambda: [8192])  # long_synthetic / pg19: prompt tokens
    tasks: list[str] = field(default_factory=lambda: ["summarise"])  # long_synthetic / pg19: continue, summarise, qa

    def __post_init__(self):
        for key in ("num_prompts", "per_category", "min_prompt_tokens", "max_prompt_tokens"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"dataset.{key}", value, "null or an integer >= 1")
        require(all(n >= 1 for n in self.lengths), "dataset.lengths", self.lengths, "prompt lengths >= 1 token")


@dataclass
class PathsConfig:
    data_root: str | None = None  # folder with the ../shared/data layout; $GRAFT_DATA overrides


@dataclass
class LoggerConfig:
    name: Literal["none", "wandb"] = "none"
    project: str = "graft"
    # auto: online when logged in to W&B (WANDB_API_KEY, ~/.netrc), else offline; WANDB_MODE wins (graft/run/wandb_mode.py)
    mode: Literal["auto", "offline", "online", "disabled"] = "auto"
    dir: str | None = None
    tags: list[str] = field(default_factory=list)
    group: str | None = None  # W&B group; None: the experiment's name (or the run's label outside one)


@dataclass
class HardwareConfig:
    name: str = "cpu"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    num_threads: int | None = None  # CPU threads for torch (None: torch's default)
    # graft/cpu/products.py; packed_bf16: packed with every product's weights rounded to bfloat16 (activations, norms,
    # attention and the cache stay float32, so the native layer loop runs; AMX tiles where the CPU has them)
    fast_path: Literal["none", "transposed", "packed", "packed_bf16", "bf16"] = "none"
    # the target's key/value cache on a fast path: auto keeps the dtype its activations run in; bfloat16 halves the
    # bytes a step's attention streams (at many sequences more than the weights), the baseline included
    cache_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # the fp32 packed path's one-row product (a decode step): x @ W_t or oneDNN; auto measures both at load
    one_row_kernel: Literal["auto", "transposed", "packed"] = "auto"
    # the lean forward's layer loop in C++ (graft/cpu/native) for forwards of a few rows: auto uses it where it
    # builds and applies (float32, CPU, dense, packed products), on refuses to load without it, off never
    native: Literal["auto", "on", "off"] = "auto"
    # the fp32 packed path's products: graft/cpu/native's panel kernel (AVX-512F) or oneDNN; auto measures both at
    # load (1-64 rows, graft/cpu/products.py PRODUCT_ROWS) and gives the panels the row counts they win (one row stays
    # x @ W_t's where that beat them), panel all (but one row with one_row_kernel=transposed), onednn none
    product_kernel: Literal["auto", "panel", "onednn"] = "auto"
    # several GPUs: "auto" shards the layers over the first model.num_gpus GPUs (Accelerate's planned device_map,
    # capped by max_memory); it overrides model.device_map. Nothing may be offloaded to the CPU or disk.
    device_map: str | None = None
    gpu_memory_fraction: float = 0.9  # of each GPU's memory the weights may take (the rest: KV cache, trees)
    tensor_parallel: bool = False  # transformers' tp_plan="auto", one process per GPU under torchrun
    # the phase clock (graft/clock.py): auto = CUDA events read once per sequence on a GPU, perf_counter on a
    # CPU; sync = synchronise at every phase boundary (a host sync each); async = perf_counter, no sync
    timing: Literal["auto", "sync", "async"] = "auto"
    # the attention kernel of transformers' forward, overriding model.attn_implementation; "graft_sdpa"
    # (graft/layers.py: grouped_sdpa) verifies a tree without copying keys/values per query head (GQA)
    attention: str | None = None
    # prompt tokens per prefill forward: longer prompts are encoded in chunks (no [prompt, prompt] mask or
    # scores; 64K-token prompts fit); null encodes every prompt in one forward
    prefill_chunk: int | None = 4096
    # trees of a fixed size per step (graft/fixed_size.py: graft_fixed): pruning marks nodes empty instead of
    # dropping them and retrieval fills slots, so a step reads one value back to the host (the accepted
    # path) and no shape depends on data; the GPU default. On a CPU the empty slots only cost time.
    fixed_size_trees: bool = False
    # with fixed_size_trees, a method that prunes verifies its kept nodes rounded up to a multiple of tree_bucket
    # (8: buckets 8, 16, ..., the budget), read back in one small extra copy per step; 0 verifies every slot
    tree_bucket: int = 8
    # torch.compile of the verify forward (transformers' forward, fast_path=none) and of the draft head's level
    # step, over static caches whose shapes stay fixed for a sequence (masks hide the unfilled slots); with
    # fixed_size_trees every step reuses one compiled graph. "reduce-overhead" replays it as a CUDA graph on a GPU.
    compile: Literal["off", "default", "reduce-overhead", "max-autotune"] = "off"
    # torch.compile's backend: inductor generates kernels; aot_eager / eager only capture the graphs (tests, debugging)
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"

    def __post_init__(self):
        require(
            self.num_threads is None or self.num_threads >= 1,
            "hardware.num_threads",
            self.num_threads,
            "null (torch's default) or an integer >= 1",
        )
        require(
            self.prefill_chunk is None or self.prefill_chunk >= 1,
            "hardware.prefill_chunk",
            self.prefill_chunk,
            "null or an integer >= 1",
        )
        require(
            self.compile == "off" or self.fast_path == "none",
            "hardware.compile",
            self.compile,
            "off with a fast path (hardware.fast_path=" + str(self.fast_path) + "); compile runs transformers' forward",
        )
        require(
            self.cache_dtype == "auto" or self.fast_path != "none",
            "hardware.cache_dtype",
            self.cache_dtype,
            "auto with hardware.fast_path=none (transformers' forward keeps its cache in the model's dtype); "
            "float32 or bfloat16 on a fast path (packed, packed_bf16, transposed, bf16)",
        )
        require(self.tree_bucket >= 0, "hardware.tree_bucket", self.tree_bucket, "0 (off) or an integer >= 1")
        require(
            0 < self.gpu_memory_fraction <= 1,
            "hardware.gpu_memory_fraction",
            self.gpu_memory_fraction,
            "a number in (0, 1]",
        )


@dataclass
class ExperimentConfig:
    run: RunConfig
    model: ModelConfig
    method: MethodConfig  # a single-method run's method (the `method` group)
    dataset: DatasetConfig
    logger: LoggerConfig
    hardware: HardwareConfig
    paths: PathsConfig
    methods: list[MethodConfig] | None = None  # a comparison: these methods against one baseline per prompt

    @property
    def compared(self) -> list[MethodConfig]:
        """The methods this run measures against the baseline."""
        return self.methods if self.methods is not None else [self.method]


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "model": ModelConfig,
    "dataset": DatasetConfig,
    "logger": LoggerConfig,
    "hardware": HardwareConfig,
    "paths": PathsConfig,
}
SCHEMA_GROUPS = {"model": ModelConfig, "dataset": DatasetConfig, "logger": LoggerConfig, "hardware": HardwareConfig}
