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
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from graft.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
        with open_dict(cfg):
            cfg.run.out_dir = "unused"
        return OmegaConf.to_container(cfg, resolve=True)


@functools.lru_cache(maxsize=None)
def load_tiny(name: str):
    """A tiny random model; `name:path` selects a fast path (default: transformers' own forward)."""
    from graft.config import validate
    from graft.models import load_model

    name, _, fast_path = name.partition(":")
    cfg = validate(compose([f"model={name}", "logger=none", f"hardware.fast_path={fast_path or 'none'}"]))
    return load_model(cfg.model, cfg.hardware, progress=False)


@pytest.fixture
def tiny():
    return load_tiny
