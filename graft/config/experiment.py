"""Typed schema of the Hydra config, and validation that names the bad key or value and what is allowed.

The YAML files under `graft/configs/` (`configs/` in the repository links there) mirror these dataclasses one
group per section. A method section holds `name`, its drafter and the keys of the parts it composes
(graft/registry.py routes and checks them); a method YAML states only what differs from the dataclass defaults
or from the method it derives from.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from graft.config.shapes import check_declared_shape
from graft.registry import PUBLISHED, MethodConfig, method_config
from graft.schema import ConfigError, coerce_dataclass, require, schema_defaults, suggest

__all__ = ["ConfigError", "ExperimentConfig", "compose", "validate", "check_overrides", "group_options"]

# the Hydra configs ship inside the package (graft/configs; the repository's configs/ links to it), so an
# installed copy finds them wherever it runs from
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


GROUPS = ("model", "method", "dataset", "logger", "hardware", "experiment")


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
    # GPUs a sharded run uses: "auto", the smallest count whose per-GPU memory plan fits (graft/plan/memory.py), settled
    # at start-up from the GPUs' free memory; a number is honoured. `${gpus_needed:}` (graft/plan/hardware.py) resolves
    # it to a number before the run (a scheduler's request): the plan's count on H200s unless told another size.
    num_gpus: int | Literal["auto"] = "auto"
    # The published config.json sizes (graft/plan/memory.SHAPE_KEYS) that the memory plan reads before loading;
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
    # auto: online when logged in to W&B (WANDB_API_KEY, ~/.netrc), else offline; WANDB_MODE wins (graft/run/tracking.py)
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
    # trees of a fixed size per step (graft/grafting.py: graft_fixed): pruning marks nodes empty instead of
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


def run_label(methods, method_name: str) -> str:
    """A run directory's method part: the method's name, or `compare` for a comparison."""
    return "compare" if methods else method_name


@functools.cache
def hardware_profile(name: str) -> dict:
    """What configs/hardware/<name>.yaml states beyond the schema defaults."""
    raw = yaml.safe_load((CONFIG_DIR / "hardware" / f"{name}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    return raw


def auto_hardware(key: str):
    """`${auto_hardware:<key>}` in configs/hardware/auto.yaml: hardware=auto's value of `key`, gpu.yaml's where
    torch sees a CUDA device, else cpu.yaml's (the schema default where that file states none). The GPU count,
    and with it gpu_multi.yaml's sharding, is settled at start-up (graft/plan/hardware.resolve_hardware)."""
    import torch

    settings = hardware_profile("gpu" if torch.cuda.is_available() else "cpu")
    return settings[key] if key in settings else schema_defaults(HardwareConfig)[key]


def register_schemas() -> None:
    """Store each group's full key set as `<group>/schema`; group YAML files start from it; register the
    config's resolvers."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("run_label", run_label, replace=True)
    OmegaConf.register_new_resolver("auto_hardware", auto_hardware, replace=True)

    store = ConfigStore.instance()
    for group, cls in SCHEMA_GROUPS.items():
        store.store(group=group, name="schema", node=schema_defaults(cls))


def validate(cfg: dict) -> ExperimentConfig:
    """Check a resolved config (plain dict) against the schema; returns the typed config, the method's
    parts typed and its draft head resolved from the model config."""
    allowed_top = [*SECTIONS, "method", "methods"]
    for key in cfg:
        if key not in allowed_top:
            raise ConfigError(
                f"unknown top-level key '{key}'; allowed: {', '.join(allowed_top)}" + suggest(key, allowed_top)
            )
    typed = {name: coerce_dataclass(cls, dict(cfg.get(name) or {}), name) for name, cls in SECTIONS.items()}
    raw_method = dict(cfg.get("method") or {})
    methods = None
    if cfg.get("methods") is not None:
        if raw_method.get("name") != "ar":
            raise ConfigError(
                f"methods={cfg['methods']} compares several methods and method={raw_method.get('name')} names one; "
                "give one of them"
            )
        shared = {k: v for k, v in raw_method.items() if k not in ("name", "drafter")}
        methods = compared_methods(cfg["methods"], shared, typed["model"])
        raw_method = {k: v for k, v in raw_method.items() if k in ("name", "drafter")}
    method = method_config(raw_method, typed["model"].draft_head, typed["model"].block_drafter)
    return ExperimentConfig(method=method, methods=methods, **typed)


def load_method_yaml(name: str) -> dict:
    """configs/method/<name>.yaml with the methods it derives from merged in, as Hydra composes it."""
    options = group_options("method")
    if name not in options:
        raise ConfigError(
            f"unknown method '{name}'; available method configs: {', '.join(options)}" + suggest(name, options)
        )
    raw = yaml.safe_load((CONFIG_DIR / "method" / f"{name}.yaml").read_text()) or {}
    defaults = raw.pop("defaults", [])
    merged: dict = {}
    for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        merged.update(raw if entry == "_self_" else load_method_yaml(entry))
    return merged


def compared_methods(names, shared: dict, model: "ModelConfig") -> list[MethodConfig]:
    """The methods of a comparison, each from its YAML; `shared` keys (method.<key>=... given with
    methods=[...]) apply to every compared method that has the key."""
    if isinstance(names, str) or not names:
        raise ConfigError(f"methods={names!r} must be a non-empty list of method configs, e.g. methods=[pld,graft]")
    if len(set(names)) != len(names):
        raise ConfigError(f"methods={list(names)} names a method twice")
    methods, used = [], set()
    for name in names:
        raw = load_method_yaml(name)
        if raw.get("drafter") == "ar":
            raise ConfigError(baseline_in_methods(f"[{','.join(names)}]", name))
        choosing = {k: v for k, v in shared.items() if k in PART_KEYS}
        keys = method_config({**raw, **choosing}, draft_head="random", block_drafter="random").keys()
        applied = {k: v for k, v in shared.items() if k in keys}
        used |= set(applied)
        for key, (model_field, what) in PUBLISHED.items():
            if key in keys and applied.get(key, raw.get(key)) is None and getattr(model, model_field) is None:
                raise ConfigError(
                    f"the compared method {name} drafts with {what}, and the model config names no {model_field}; "
                    f"give one with method.{key}=<Hub id or local directory> or compare methods without one, "
                    "e.g. methods=[pld] or methods=[pld,recycling,suffix]"
                )
        methods.append(method_config({**raw, **applied}, model.draft_head, model.block_drafter))
    unused = sorted(set(shared) - used)
    if unused:
        raise ConfigError(f"method.{unused[0]} is a key of none of the compared methods {list(names)}")
    return methods


def baseline_in_methods(listed: str, name: str = "ar") -> str:
    """Why a comparison may not list the baseline: every comparison runs `ar` once per prompt as its baseline,
    and its row is the ratios' denominator (1.00x by definition); listed again, it would be measured against
    itself and shown with a noise 'speedup'."""
    return (
        f"methods={listed} lists {name}, the autoregressive baseline every comparison already runs (its row is "
        "1.00x by definition); a comparison needs at least one method besides it, e.g. methods=[pld], "
        "or method=ar for the baseline alone"
    )


def compose(overrides: list[str]) -> dict:
    """The resolved config dict that `python run.py <overrides>` would see (run.out_dir left unset)."""
    return _compose_prepared(prepare_overrides(overrides))


def compose_checked(overrides: list[str]) -> dict:
    """compose() for the package's commands (check-lossless, the cost model's): the overrides checked as run.py
    checks them (check_overrides), and whatever Hydra still refuses as one ConfigError line (hydra_problem)."""
    prepared = check_overrides(list(overrides))
    try:
        return _compose_prepared(prepared)
    except Exception as err:
        if type(err).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        raise ConfigError(hydra_problem(err)) from None


def hydra_problem(err: Exception) -> str:
    """What Hydra or OmegaConf said about a config, as one line: its sentences joined, a listing of options
    comma-separated, the cause's first line added; where it searched and indented details left out."""
    parts, skipping = [], False
    cause = str(err.__cause__ or "").strip().splitlines()[:1]
    for line in [*str(err).splitlines(), *cause]:
        if not line.strip() or line.startswith("    "):
            continue
        if line.startswith("\t"):  # an option of the listing above
            if not skipping:
                parts[-1] = f"{parts[-1].rstrip(':')}{':' if parts[-1][-1:] == ':' else ','} {line.strip()}"
            continue
        skipping = line.startswith(("Config search path", "Set the environment variable"))
        if not skipping and line.strip().rstrip(".") not in parts:
            parts.append(line.strip().rstrip("."))
    return "; ".join(parts) or type(err).__name__


def _compose_prepared(overrides: list[str]) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
        with open_dict(cfg):
            cfg.run.out_dir = "unused"
        return OmegaConf.to_container(cfg, resolve=True)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def method_override(arg: str) -> str:
    """`method.<key>=v` as `++method.<key>=v`: a method YAML holds only what differs from the defaults,
    and Hydra refuses to override a key the composed YAML lacks."""
    return f"++{arg.lstrip('+')}" if arg.lstrip("+").startswith("method.") else arg


def names_one_method(argv: list[str]) -> bool:
    """The command line names a method (method=...) and no comparison (methods=...): a single-method run."""
    return any(a.lstrip("+").startswith("method=") for a in argv) and not any(a.startswith("methods=") for a in argv)


def prepare_overrides(argv: list[str]) -> list[str]:
    """The overrides as Hydra needs them: method keys via method_override, and `methods=null` when the
    command line names one method but no comparison."""
    out = [method_override(a) if "=" in a and not a.startswith("-") else a for a in argv]
    out = place_hydra_files(out)
    return [*out, "methods=null"] if names_one_method(argv) else out


def check_out_dir(path: str) -> None:
    """Hydra creates the folder before any of our code runs: a file in the way or a folder that cannot be
    written is refused here, in one line."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"run.out_dir={path} is a file, not a folder")
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run.out_dir={path} cannot be written ({existing} is not writable)")


def unquoted(value: str) -> str:
    """An override's value without the quotes Hydra's grammar takes off ('a b' or "a b")."""
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def home_expanded(arg: str) -> str:
    """`run.out_dir="~/x"` with ~ expanded, as a shell would: Hydra keeps the ~, and the run would write into a
    folder named ~ under the current one (the unquoted form is refused by Hydra's grammar: check_syntax)."""
    key, _, value = arg.partition("=")
    inner = unquoted(value)
    if not inner.startswith("~") or inner == value:
        return arg
    return f"{key}={value[0]}{os.path.expanduser(inner)}{value[0]}"


def place_hydra_files(argv: list[str]) -> list[str]:
    """A run writes only where the user said: with `run.out_dir=X`, Hydra's own folder (.hydra, the job
    log) goes into X too instead of a new folder under ./outputs. In a sweep, `run.out_dir=X` becomes the
    sweep's folder (`hydra.sweep.dir=X`), each job in its own subfolder, instead of every job claiming X."""
    argv = [home_expanded(a) if a.lstrip("+").startswith("run.out_dir=") else a for a in argv]
    pinned = [a for a in argv if a.lstrip("+").startswith("run.out_dir=")]
    if not pinned:
        return argv
    target = pinned[-1].split("=", 1)[1]
    check_out_dir(unquoted(target))
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if multirun:
        rest = [a for a in argv if a not in pinned]
        return rest if any(a.startswith("hydra.sweep.dir=") for a in rest) else [*rest, f"hydra.sweep.dir={target}"]
    return argv if any(a.startswith("hydra.run.dir=") for a in argv) else [*argv, f"hydra.run.dir={target}"]


PART_KEYS = ("drafter", "source", "split", "retrieval", "attach", "combine")  # method keys that choose parts


HYDRA_VALUE_FLAGS = {  # Hydra's command-line flags whose value is the next argument
    "--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
    "--info", "-i", "--experimental-rerun",
}  # fmt: skip


def check_syntax(argv: list[str]) -> None:
    """Each override as Hydra's grammar reads it: an unquoted ~, a non-ASCII letter or a bracket that Hydra's
    lexer rejects (with a caret under the command line) is one ConfigError naming the override, the character
    and the quoting that passes it on as it was meant."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    after_flag = False
    for arg in argv:
        # Hydra's own flags and the value of those that take one (--cfg job, -cn NAME) are not overrides
        if arg.startswith("-") or after_flag:
            after_flag = arg in HYDRA_VALUE_FLAGS  # not "--cfg=job", which carries its value
            continue
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as err:
            raise ConfigError(_syntax_problem(arg, str(err))) from None


def _syntax_problem(arg: str, message: str) -> str:
    lines = message.splitlines()
    where = ""
    if len(lines) > 1 and lines[1].strip() == "^" and ": " in lines[0]:  # the lexer's caret under the command line
        column = lines[1].index("^") - (lines[0].index(": ") + 2)
        if 0 <= column < len(arg):
            where = f" at {arg[column]!r} (character {column + 1})"
    else:
        where = f" ({lines[0].strip()})" if lines else ""
    key, equals, value = arg.partition("=")
    if not equals:
        return f"the override '{arg}' is not valid Hydra syntax{where}; an override is key=value"
    if "'" in value or '"' in value:
        quoting = "quote the value for Hydra inside the shell's quotes, escaping its own quotes"
    else:
        quoting = f"""quote the value for Hydra, inside the shell's quotes: '{key}="{value}"'"""
    return f"the override '{arg}' is not valid Hydra syntax{where}; {quoting}"


def check_early_values(argv: list[str]) -> None:
    """Values a launcher's config reads while Hydra resolves it, before validate() would see them (the SLURM
    launcher's GPU count reads model.num_gpus): checked here, so a bad one is one line, not Hydra's traceback."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "model.num_gpus":
            for one in value.split(","):
                require(
                    one == "auto" or (one.isdigit() and int(one) >= 1), "model.num_gpus", one, "auto or an integer >= 1"
                )


def check_sweeps(argv: list[str]) -> None:
    """A group option swept with a comma (method=pld,graft) without -m: Hydra refuses it and suggests a list,
    which a group does not take; name the two things the user may have meant."""
    if any(a in ("-m", "--multirun") or a.startswith("--multirun=") for a in argv):
        shown = [a for a in argv if a in ("--cfg", "-c", "--info", "-i") or a.startswith(("--cfg=", "--info="))]
        if shown:  # Hydra: "Only one of --run, --multirun, --cfg, ..." as a traceback
            raise ConfigError(
                f"{shown[0]} shows one run's config, -m runs a sweep: drop -m to see a job's config "
                f"(python run.py {' '.join(a for a in argv if a not in ('-m', '--multirun'))})"
            )
        return
    for arg in argv:
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        if key in GROUPS and "," in value and not value.startswith(("[", "'", '"')) and "(" not in value:
            also = f"; to compare methods in one run: methods=[{value}]" if key == "method" else ""
            raise ConfigError(
                f"{arg}: a comma sweeps over {key} options, one run each; add -m (python run.py -m {arg}){also}"
            )


def check_overrides(argv: list[str]) -> list[str]:
    """Fail fast on command-line overrides that name an unknown group option or key; returns argv with
    method keys written as Hydra needs them (method_override), and `methods=null` added when the command
    line names one method (method=...) but no comparison (methods=[...]): a single-method run.

    Hydra would also refuse most of these, but with a stack of composition errors; this names the key
    and lists what is allowed. Sweep syntax (a,b or functions) is checked value by value where possible.
    """
    check_syntax(argv)
    check_sweeps(argv)
    check_early_values(argv)
    methods = [_default_choice("method")]
    for arg in argv:
        if arg.startswith("method=") and "(" not in arg:
            methods = arg.split("=", 1)[1].split(",")
    single = names_one_method(argv)
    method_args, out = [], []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            out.append(arg)
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra"):
            out.append(arg)
            continue
        if key == "methods":
            options = group_options("method")
            for name in value.strip("[]").split(","):
                name = name.strip()
                if name and name != "null" and name not in options:
                    raise ConfigError(
                        f"unknown method '{name}' in methods; available method configs: {', '.join(options)}"
                        + suggest(name, options)
                    )
                if name == "ar":
                    raise ConfigError(baseline_in_methods(value))
            out.append(arg)
            continue
        if "." not in key:
            if key not in GROUPS:
                allowed = [*GROUPS, "methods", *(f"{s}.<key>" for s in (*SECTIONS, "method"))]
                raise ConfigError(
                    f"unknown override '{key}'; allowed: {', '.join(allowed)}" + suggest(key, list(GROUPS))
                )
            if "(" not in value:
                options = group_options(key)
                for option in value.split(","):
                    if option and option != "null" and option not in options:
                        raise ConfigError(
                            f"unknown {key} '{option}'; available {key} configs: {', '.join(options)}"
                            + suggest(option, options)
                        )
            out.append(arg)
            continue
        section, _, field_name = key.partition(".")
        field_name = field_name.split(".")[0]
        if section == "method":
            method_args.append((field_name, value))
            out.append(arg)
            continue
        if section not in SECTIONS:
            allowed = [*SECTIONS, "method"]
            raise ConfigError(
                f"unknown config section '{section}' in '{arg}'; sections: {', '.join(allowed)}"
                + suggest(section, allowed)
            )
        names = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if field_name not in names:
            raise ConfigError(
                f"unknown key '{key}'; allowed keys in {section}: {', '.join(names)}" + suggest(field_name, names)
            )
        out.append(arg)
    if method_args and single:  # in a comparison, validation checks shared keys against the compared methods
        _check_method_keys(methods, method_args)
    return prepare_overrides(out)


def _check_method_keys(methods: list[str], method_args: list[tuple[str, str]]) -> None:
    """Each `method.<key>` names a key of the method as composed (with any part-choosing overrides)."""
    choosing = [f"++method.{k}={v}" for k, v in method_args if k in PART_KEYS]
    if any("," in v for k, v in method_args if k in PART_KEYS):
        return  # a sweep over parts: each job's validation checks its own keys
    for method in methods:
        if method not in group_options("method"):
            continue
        raw = compose([f"method={method}", *choosing])["method"]
        keys = method_config(raw, draft_head="random", block_drafter="random").keys()
        for key, _ in method_args:
            if key not in keys:
                raise ConfigError(
                    f"unknown key 'method.{key}'; allowed keys in method ({method}): {', '.join(keys)}"
                    + suggest(key, keys)
                )


def _default_choice(group: str) -> str | None:
    root = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    for entry in root.get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return None
