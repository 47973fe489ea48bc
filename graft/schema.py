"""Checking plain mappings against dataclasses: unknown keys, wrong types and disallowed values become
ConfigErrors that name the key, the value and what is allowed (with a "did you mean")."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A bad key or value in the configuration; the message says what is allowed."""


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


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")


def suggest(name: str, allowed: list[str]) -> str:
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
                + suggest(str(value), [str(a) for a in allowed])
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
                f"unknown key '{key}' in {section}; allowed keys: {', '.join(names)}" + suggest(key, names)
            )
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
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
