"""Where a model, head or drafter comes from: a local path or a Hugging Face Hub id."""

from __future__ import annotations


def looks_local(path: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else that is not on disk was meant as a local path."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path
