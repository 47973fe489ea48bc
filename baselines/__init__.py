"""Comparison methods. Importing this package registers them with `graft.drafter.register`."""

from baselines import pld, recycling, samd, suffix  # noqa: F401
