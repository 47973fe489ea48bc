"""Every method part by name, and the typed method config built from a method's flat YAML keys.

Part kinds: `source` (drafts a tree: EAGLE dense, EAGLE-1 static), `split` (how much of the budget the
draft keeps: dense, confidence stages, fixed, confident chain), `retriever` (proposes tokens without a
model: Token Recycling, suffix automaton, prompt lookup), `attach` (where retrieved subtrees join the
draft: root, leaves, both, tail), `trim` (cuts the united tree to the size that pays on this device: auto),
and `drafter` (a whole drafter: `composed` puts the parts together;
`ar` is the baseline). A module registers its parts with `@register(kind, name, params)`; every module
in graft/methods/ and baselines/ is imported by `discover()`, so a new file there plus a YAML under
configs/method/ is a new method, with nothing else edited.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from graft.schema import ConfigError, coerce_dataclass, suggest

KINDS = ("source", "split", "retriever", "attach", "trim", "drafter")
PACKAGES = (
    "graft.parts",
    "graft.compose",
    "graft.methods",
    "baselines",
)  # imported by discover(), packages module by module


@dataclass
class NoParams:
    pass


@dataclass
class Part:
    kind: str
    name: str
    factory: Callable  # a class (or function) building the part
    params: type  # its params dataclass; field names are the method YAML keys it owns
    description: str = ""


PARTS: dict[str, dict[str, Part]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str, params: type = NoParams, description: str = ""):
    """Decorator: make a part available by `name` (a source, split, retriever, attach policy or drafter)."""
    if kind not in KINDS:
        raise ValueError(f"part kind {kind!r}; allowed: {', '.join(KINDS)}")

    def wrap(factory):
        PARTS[kind][name] = Part(kind, name, factory, params, description)
        return factory

    return wrap


_discovered = False


def discover() -> None:
    """Import every module of graft/methods/ and baselines/ (and the composer) so their parts register."""
    global _discovered
    if _discovered:
        return
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
            importlib.import_module(f"{package_name}.{module.name}")
    _discovered = True


def part(kind: str, name: str, key: str | None = None) -> Part:
    discover()
    if name not in PARTS[kind]:
        options = sorted(PARTS[kind])
        where = f"method.{key or kind}={name!r}" if key else f"{kind} {name!r}"
        raise ConfigError(
            f"{where} is not a known {kind}; available: {', '.join(options)}" + suggest(str(name), options)
        )
    return PARTS[kind][name]


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@dataclass
class MethodConfig:
    """A method, validated: its drafter's own params and the params of every part it composes."""

    name: str  # the method's config name (configs/method/<name>.yaml); records and run directories use it
    drafter: str
    params: Any  # the drafter's params dataclass
    parts: dict[tuple[str, str], Any] = field(default_factory=dict)  # (kind, part name) -> its params

    def of(self, kind: str, name: str):
        return self.parts[(kind, name)]

    def keys(self) -> list[str]:
        """Every key this method's YAML may set."""
        fields = [k for params in (self.params, *self.parts.values()) for k in field_names(type(params))]
        return list(dict.fromkeys(["name", "drafter", *fields]))

    def flat(self) -> dict:
        """The method as flat keys with every value resolved (defaults and the model's head included)."""
        values = {"name": self.name, "drafter": self.drafter}
        for params in (self.params, *self.parts.values()):
            values.update(dataclasses.asdict(params))
        return values


# a part's key that names a trained drafter, and the model config field naming the model's own one
PUBLISHED = {"head": ("draft_head", "an EAGLE head"), "checkpoint": ("block_drafter", "a block drafter")}


def method_config(raw: dict, draft_head: str | None = None, block_drafter: str | None = None) -> MethodConfig:
    """Route a method's flat keys to its drafter and the parts that drafter composes, check each against
    its params dataclass, and resolve `head: null` to the model's published EAGLE head (`draft_head`) and
    `checkpoint: null` to its block drafter (`block_drafter`)."""
    published = {"head": draft_head, "checkpoint": block_drafter}
    raw = dict(raw)
    name = raw.pop("name", None)
    if not name:
        raise ConfigError("the method config has no 'name'")
    drafter = part("drafter", raw.pop("drafter", "composed"), "drafter")
    section = f"method ({name})"
    own_keys = field_names(drafter.params)
    params = coerce_dataclass(drafter.params, {k: v for k, v in raw.items() if k in own_keys}, section)
    components = getattr(drafter.factory, "components", lambda p: [])(params)  # [(kind, name, key)]
    chosen = [(kind, part(kind, part_name, key)) for kind, part_name, key in components]
    allowed = ["name", "drafter", *own_keys, *(k for _, p in chosen for k in field_names(p.params))]
    for key in raw:
        if key not in allowed:
            raise ConfigError(
                f"unknown key 'method.{key}' for method {name}; allowed keys: {', '.join(dict.fromkeys(allowed))}"
                + suggest(key, allowed)
            )
    parts = {}
    for kind, p in chosen:
        values = {k: v for k, v in raw.items() if k in field_names(p.params)}
        for key, (model_field, what) in PUBLISHED.items():
            if key in field_names(p.params) and values.get(key) is None:
                if published[key] is None:
                    raise ConfigError(
                        f"method {name} drafts with {what}, but neither method.{key} nor the model's {model_field} "
                        f"names one; set method.{key}=<Hub id, local directory or 'random'>"
                    )
                values[key] = published[key]
        parts[(kind, p.name)] = coerce_dataclass(p.params, values, f"{section}, {kind} {p.name}")
    config = MethodConfig(name=name, drafter=drafter.name, params=params, parts=parts)
    getattr(drafter.factory, "check", lambda c: None)(config)
    return config


def build_drafter(method: MethodConfig, target, batch_size: int = 1):
    """The drafter for a validated method config, on `target`, for a run of `batch_size` sequences at a time
    (run.batch_size: a cost-aware method measures its costs at it)."""
    return part("drafter", method.drafter).factory(target, method, batch_size=batch_size)


def build_part(method: MethodConfig, kind: str, name: str, *args):
    return part(kind, name).factory(method.of(kind, name), *args)
