from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")

import torch  # noqa: E402

# Random-weight tiny models drift into subnormal floats on some prompts, which makes x86 math ~25x slower
# (measured: 108 ms vs 4 ms per tiny decode step). Flushing them changes nothing the tests compare.
torch.set_flush_denormal(True)


def compose(overrides: list[str]) -> dict:
    """The resolved config dict that `python run.py <overrides>` would see."""
    from graft.config import compose as compose_config

    return compose_config(overrides)


@functools.lru_cache(maxsize=None)
def load_tiny(name: str):
    """A tiny random model; `name:path` selects a fast path (default: transformers' own forward)."""
    from graft.config import validate
    from graft.models import load_model

    name, _, fast_path = name.partition(":")
    cfg = validate(compose([f"model={name}", "logger=none", f"hardware.fast_path={fast_path or 'none'}"]))
    model = load_model(cfg.model, cfg.hardware, progress=False)
    torch.set_flush_denormal(True)  # again: loading may reset the floating-point mode
    return model


@pytest.fixture
def tiny():
    return load_tiny
