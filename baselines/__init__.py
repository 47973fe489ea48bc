"""Comparison methods: the autoregressive baseline and the retrievers of the retrieval baselines (Token
Recycling, suffix automaton, prompt lookup). `graft.registry.discover()` imports every module here."""
