"""Retrieval structures that propose tokens without a model: the Token-Recycling successor table read through
static rank templates, and a suffix automaton over prompt + output."""
