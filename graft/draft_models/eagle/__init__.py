"""EAGLE draft heads and their checkpoints."""
