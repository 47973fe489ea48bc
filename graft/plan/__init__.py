"""Planning a run before it loads: which hardware settings a model needs (hardware.py) and whether it fits in memory (memory.py)."""
