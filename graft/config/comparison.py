"""The methods of a comparison (methods=[...]): each read from its YAML as Hydra composes it, the shared
`method.<key>` overrides applied to those that have the key, and the baseline refused in the list.
"""

from __future__ import annotations

import yaml

from graft.config.hydra_setup import CONFIG_DIR, group_options
from graft.config.schema import ModelConfig
from graft.registry import PUBLISHED, MethodConfig, method_config
from graft.schema import ConfigError, suggest

PART_KEYS = ("drafter", "source", "split", "retrieval", "attach", "combine")  # method keys that choose parts


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
