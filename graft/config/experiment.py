"""The experiment config of a command line: the resolved dict Hydra composes from its overrides (compose), checked
against the schema (graft/config/schema.py) into a typed ExperimentConfig (validate).
"""

from __future__ import annotations

from graft.config.comparison import compared_methods
from graft.config.hydra_setup import compose_prepared
from graft.config.overrides import prepare_overrides
from graft.config.schema import SECTIONS, ExperimentConfig
from graft.registry import method_config
from graft.schema import ConfigError, coerce_dataclass, suggest


def compose(overrides: list[str]) -> dict:
    """The resolved config dict that `python run.py <overrides>` would see (run.out_dir left unset)."""
    return compose_prepared(prepare_overrides(overrides))


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
