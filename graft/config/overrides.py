"""A command line's overrides rewritten as Hydra needs them (prepare_overrides): `method.<key>` as a key Hydra
may add, `methods=null` for a single-method run, and Hydra's own files written into run.out_dir.
"""

from __future__ import annotations

import os
from pathlib import Path

from graft.schema import ConfigError


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
