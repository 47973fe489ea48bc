"""Measurements a user runs on their machine: `python -m graft.bench <command>` (each command's `--help`)."""
