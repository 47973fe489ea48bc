"""Which device a run uses, from its hardware config."""

from __future__ import annotations

import torch

from graft.config import HardwareConfig
from graft.schema import ConfigError


def resolve_device(hardware: HardwareConfig) -> torch.device:
    if hardware.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if hardware.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("hardware.device='cuda' but torch sees no CUDA device; use hardware=cpu")
    return torch.device(hardware.device)
