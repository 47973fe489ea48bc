"""Measurements a user runs on their machine: `python -m graft.bench <command>` (each command's `--help`)."""

from __future__ import annotations

import argparse


def command_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """The arguments of `python -m graft.bench <command>`, its module docstring as the help, laid out as written."""
    return argparse.ArgumentParser(
        prog=f"python -m graft.bench {command}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def batch_sizes(text: str, least: int, example: str, flag: str = "--sizes", what: str = "batch sizes") -> list[int]:
    """`flag`'s comma-separated integers, each >= `least`; anything else is one line naming the value and what
    is allowed."""
    from graft.schema import ConfigError

    try:
        sizes = [int(size) for size in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < least:
        raise ConfigError(f"{flag} {text} is not allowed; expected {what} >= {least}, comma-separated ({example})")
    return sizes


def at_least(**flags: tuple[int, int]) -> None:
    """Each option (its flag with underscores, its value, its least) an integer at least its least, else one line:
    at_least(rounds=(args.rounds, 1))."""
    from graft.schema import ConfigError

    for name, (value, least) in flags.items():
        if value < least:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {value} is not allowed; expected an integer >= {least}")


def model_config(name: str) -> str:
    """`name` where configs/model/ has it, else one line naming the models there."""
    from graft.config.hydra_setup import CONFIG_DIR
    from graft.schema import ConfigError

    known = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
    if name not in known:
        raise ConfigError(f"--model {name}: unknown; the models are {', '.join(known)}")
    return name
