"""Target backends: the interface the decode loop verifies trees through (target.py) and transformers' own forward (hf.py)."""
