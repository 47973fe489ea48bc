"""Typed schema of the Hydra config, and validation that names the bad key or value and what is allowed.

The YAML files under `configs/` mirror these dataclasses one group per section. A method section holds
`name`, its drafter and the keys of the parts it composes (graft/registry.py routes and checks them);
a method YAML states only what differs from the dataclass defaults or from the method it derives from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from graft.registry import MethodConfig, method_config
from graft.schema import ConfigError, coerce_dataclass, require, schema_defaults, suggest

__all__ = ["ConfigError", "ExperimentConfig", "compose", "validate", "check_overrides", "group_options"]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("model", "method", "dataset", "logger", "hardware", "experiment")


@dataclass
class RunConfig:
    num_prompts: int | None = None  # first N prompts of the dataset (None: all)
    max_new_tokens: int = 128  # per turn
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    out_dir: str = "outputs/run"
    warmup: bool = True  # one untimed generation per decoder before the timed prompts
    warmup_tokens: int = 16
    float_tie_ulps: int = (
        16  # a divergence is a float tie when the baseline's top-2 gap <= this many ulps of its top logit
    )
    progress: bool = True
    score: bool = False  # GSM8K exact match / HumanEval pass@1 where the dataset has references

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
    hardware_hint: str = ""  # what it needs, for people choosing a node


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
    min_prompt_tokens: int | None = None  # first turn, chat template included, target's tokenizer
    max_prompt_tokens: int | None = None
    prompt_template: str | None = None  # how a record becomes the first user turn, e.g. "{question}"
    subsets: list[str] | None = None  # longbench
    lengths: list[int] = field(default_factory=lambda: [8192])  # long_synthetic / pg19: prompt tokens
    tasks: list[str] = field(default_factory=lambda: ["summarise"])  # long_synthetic / pg19: continue, summarise, qa


@dataclass
class PathsConfig:
    data_root: str | None = None  # folder with the ../shared/data layout; $GRAFT_DATA overrides


@dataclass
class LoggerConfig:
    name: Literal["none", "wandb"] = "none"
    project: str = "graft"
    mode: Literal["offline", "online", "disabled"] = "offline"
    dir: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class HardwareConfig:
    name: str = "cpu"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    num_threads: int | None = None  # CPU threads for torch (None: torch's default)
    fast_path: Literal["none", "transposed", "packed", "bf16"] = "none"  # graft/fast.py


@dataclass
class ExperimentConfig:
    run: RunConfig
    model: ModelConfig
    method: MethodConfig
    dataset: DatasetConfig
    logger: LoggerConfig
    hardware: HardwareConfig
    paths: PathsConfig


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "model": ModelConfig,
    "dataset": DatasetConfig,
    "logger": LoggerConfig,
    "hardware": HardwareConfig,
    "paths": PathsConfig,
}


SCHEMA_GROUPS = {"model": ModelConfig, "dataset": DatasetConfig, "logger": LoggerConfig, "hardware": HardwareConfig}


def register_schemas() -> None:
    """Store each group's full key set as `<group>/schema`; group YAML files start from it."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, cls in SCHEMA_GROUPS.items():
        store.store(group=group, name="schema", node=schema_defaults(cls))


def validate(cfg: dict) -> ExperimentConfig:
    """Check a resolved config (plain dict) against the schema; returns the typed config, the method's
    parts typed and its draft head resolved from the model config."""
    allowed_top = [*SECTIONS, "method"]
    for key in cfg:
        if key not in allowed_top:
            raise ConfigError(
                f"unknown top-level key '{key}'; allowed: {', '.join(allowed_top)}" + suggest(key, allowed_top)
            )
    typed = {name: coerce_dataclass(cls, dict(cfg.get(name) or {}), name) for name, cls in SECTIONS.items()}
    method = method_config(dict(cfg.get("method") or {}), typed["model"].draft_head)
    return ExperimentConfig(method=method, **typed)


def compose(overrides: list[str]) -> dict:
    """The resolved config dict that `python run.py <overrides>` would see (run.out_dir left unset)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[method_override(o) for o in overrides])
        with open_dict(cfg):
            cfg.run.out_dir = "unused"
        return OmegaConf.to_container(cfg, resolve=True)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def method_override(arg: str) -> str:
    """`method.<key>=v` as `++method.<key>=v`: a method YAML holds only what differs from the defaults,
    and Hydra refuses to override a key the composed YAML lacks."""
    return f"++{arg.lstrip('+')}" if arg.lstrip("+").startswith("method.") else arg


PART_KEYS = ("drafter", "source", "split", "retrieval", "attach", "combine")  # method keys that choose parts


def check_overrides(argv: list[str]) -> list[str]:
    """Fail fast on command-line overrides that name an unknown group option or key; returns argv with
    method keys written as Hydra needs them (method_override).

    Hydra would also refuse most of these, but with a stack of composition errors; this names the key
    and lists what is allowed. Sweep syntax (a,b or functions) is checked value by value where possible.
    """
    methods = [_default_choice("method")]
    for arg in argv:
        if arg.startswith("method=") and "(" not in arg:
            methods = arg.split("=", 1)[1].split(",")
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
        if "." not in key:
            if key not in GROUPS:
                allowed = [*GROUPS, *(f"{s}.<key>" for s in (*SECTIONS, "method"))]
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
            out.append(method_override(arg))
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
    if method_args:
        _check_method_keys(methods, method_args)
    return out


def _check_method_keys(methods: list[str], method_args: list[tuple[str, str]]) -> None:
    """Each `method.<key>` names a key of the method as composed (with any part-choosing overrides)."""
    choosing = [f"++method.{k}={v}" for k, v in method_args if k in PART_KEYS]
    if any("," in v for k, v in method_args if k in PART_KEYS):
        return  # a sweep over parts: each job's validation checks its own keys
    for method in methods:
        if method not in group_options("method"):
            continue
        raw = compose([f"method={method}", *choosing])["method"]
        keys = method_config(raw, draft_head="random").keys()
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
