from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Prompt:
    """One conversation: user turns; each later turn continues with the model's own earlier answers."""

    id: str
    category: str
    turns: list[str]
    meta: dict = field(default_factory=dict)  # reference answer, tests, source length, ...


class DatasetError(ValueError):
    """Bad or missing dataset input; the message names the file, line or setting and what to do."""
