"""Native (C++) kernels of the CPU engine; build.py builds them once per machine and instruction-set variant and loads them."""
