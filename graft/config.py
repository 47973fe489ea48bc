"""Typed schema of the Hydra config, and validation that names the bad key or value and what is allowed.

The YAML files under `configs/` mirror these dataclasses one group per section. Method sections hold
`name` plus that method's own params dataclass (declared where the method is registered).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("model", "method", "dataset", "logger", "hardware", "experiment")


class ConfigError(ValueError):
    """A bad key or value in the configuration; the message says what is allowed."""


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
    float_tie_ulps: int = 16  # a divergence is a float tie when the baseline's top-2 gap <= this many ulps of its top logit
    progress: bool = True
    score: bool = False  # GSM8K exact match / HumanEval pass@1 where the dataset has references

    def __post_init__(self):
        _require(self.max_new_tokens >= 1, "run.max_new_tokens", self.max_new_tokens, "an integer >= 1")
        _require(self.temperature >= 0, "run.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        _require(0 < self.top_p <= 1, "run.top_p", self.top_p, "a number in (0, 1]")
        _require(self.num_prompts is None or self.num_prompts >= 1, "run.num_prompts", self.num_prompts, "null or an integer >= 1")


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
    source: Literal["builtin", "question_jsonl", "eagle", "mt_bench", "humaneval", "gsm8k", "longbench", "pg19", "long_synthetic"] = "builtin"
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
    method: dict  # name + the method's params, checked against its params dataclass
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


def schema_defaults(cls: type) -> dict:
    """Every field of a section with its default ('???' when required), so any key can be overridden."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
        else:
            values[f.name] = "???"
    return values


def register_schemas() -> None:
    """Store each group's full key set as `<group>/schema`; group YAML files start from it."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, cls in SCHEMA_GROUPS.items():
        store.store(group=group, name="schema", node=schema_defaults(cls))


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")


def _suggest(name: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


_SCALARS = {
    bool: ((bool,), "true or false"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
}


def _check_type(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}={value!r} has the wrong type; expected {hint}")
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(
                f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, allowed))}"
                + _suggest(str(value), [str(a) for a in allowed])
            )
        return value
    if origin is list or hint is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r} must be a list")
        return list(value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if hint in _SCALARS:
        accepted, words = _SCALARS[hint]
        if not isinstance(value, accepted) or (hint is not bool and isinstance(value, bool)):
            raise ConfigError(f"{key}={value!r} must be {words}")
        return float(value) if hint is float else value
    return value


def coerce_dataclass(cls: type, values: dict, section: str):
    """Build `cls` from a plain mapping; unknown keys, wrong types and disallowed values are ConfigErrors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise ConfigError(
                f"unknown key '{key}' in {section}; allowed keys: {', '.join(names)}" + _suggest(key, names)
            )
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise ConfigError(f"{section} is missing required key(s): {', '.join(missing)}")
    checked = {key: _check_type(value, hints[key], f"{section.split(' ')[0]}.{key}") for key, value in values.items()}
    try:
        return cls(**checked)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{section}: {err}") from err


def validate(cfg: dict) -> ExperimentConfig:
    """Check a resolved config (plain dict) against the schema; returns the typed config."""
    from graft.drafter import METHODS, _import_methods

    allowed_top = [*SECTIONS, "method"]
    for key in cfg:
        if key not in allowed_top:
            raise ConfigError(f"unknown top-level key '{key}'; allowed: {', '.join(allowed_top)}" + _suggest(key, allowed_top))
    typed = {name: coerce_dataclass(cls, dict(cfg.get(name) or {}), name) for name, cls in SECTIONS.items()}
    method = dict(cfg.get("method") or {})
    _import_methods()
    name = method.pop("name", None)
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; available: {', '.join(sorted(METHODS))}" + _suggest(str(name), sorted(METHODS)))
    coerce_dataclass(METHODS[name].params, method, f"method ({name})")
    return ExperimentConfig(method={"name": name, **method}, **typed)


def compose(overrides: list[str]) -> dict:
    """The resolved config dict that `python run.py <overrides>` would see (run.out_dir left unset)."""
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


def check_overrides(argv: list[str]) -> None:
    """Fail fast on command-line overrides that name an unknown group option or key.

    Hydra would also refuse most of these, but with a stack of composition errors; this names the key
    and lists what is allowed. Sweep syntax (a,b or functions) is checked value by value where possible.
    """
    from graft.drafter import METHODS, _import_methods

    chosen_method = None
    for arg in argv:
        if arg.startswith("method=") and "," not in arg:
            chosen_method = arg.split("=", 1)[1]
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra"):
            continue
        if "." not in key:
            if key not in GROUPS:
                allowed = [*GROUPS, *(f"{s}.<key>" for s in (*SECTIONS, "method"))]
                raise ConfigError(f"unknown override '{key}'; allowed: {', '.join(allowed)}" + _suggest(key, list(GROUPS)))
            if "(" in value:
                continue
            options = group_options(key)
            for option in value.split(","):
                if option and option != "null" and option not in options:
                    raise ConfigError(
                        f"unknown {key} '{option}'; available {key} configs: {', '.join(options)}" + _suggest(option, options)
                    )
            continue
        section, _, field_name = key.partition(".")
        field_name = field_name.split(".")[0]
        if section in SECTIONS:
            names = [f.name for f in dataclasses.fields(SECTIONS[section])]
        elif section == "method":
            _import_methods()
            method = chosen_method or _default_choice("method")
            if method not in METHODS:
                continue
            names = ["name", *(f.name for f in dataclasses.fields(METHODS[method].params))]
        else:
            allowed = [*SECTIONS, "method"]
            raise ConfigError(f"unknown config section '{section}' in '{arg}'; sections: {', '.join(allowed)}" + _suggest(section, allowed))
        if field_name not in names:
            raise ConfigError(f"unknown key '{key}'; allowed keys in {section}: {', '.join(names)}" + _suggest(field_name, names))


def _default_choice(group: str) -> str | None:
    import yaml

    root = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    for entry in root.get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return None
