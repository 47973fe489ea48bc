"""Prompt sets: the built-in prompts, the benchmark files (local or Hub), long-context sets and answer scoring; loading.py applies a dataset config."""
