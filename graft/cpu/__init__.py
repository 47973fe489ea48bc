"""The CPU engine: what makes the embedded default fast on a laptop or a CI machine.

The lean backend (lean.py), the product layouts and their choice at load (products.py), the native layer loop
and kernels (native/), the thread policy (threads.py), the layouts the memory plan counts (layout.py), and the
`ops` it hands the research core (ops.py, head.py). The core imports nothing from here; docs/cpu_engine.md
says what each part does and what it measured.
"""
