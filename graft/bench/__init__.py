"""Measurements a user runs on their machine: `python -m graft.bench <command>` (each command's `--help`)."""

from __future__ import annotations

import argparse


def command_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """The arguments of `python -m graft.bench <command>`, its module docstring as the help, laid out as written."""
    return argparse.ArgumentParser(
        prog=f"python -m graft.bench {command}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def batch_sizes(text: str, least: int, example: str) -> list[int]:
    """`--sizes` as integers >= `least`; anything else is one line naming the value and what is allowed."""
    from graft.schema import ConfigError

    try:
        sizes = [int(size) for size in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < least:
        raise ConfigError(
            f"--sizes {text} is not allowed; expected batch sizes >= {least}, comma-separated ({example})"
        )
    return sizes
