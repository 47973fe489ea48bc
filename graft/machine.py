"""What machine a record or a cost profile was measured on: kept apart from graft.records, which imports
the CPU engine, so that the core (graft.costmodel) can name the CPU too."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
