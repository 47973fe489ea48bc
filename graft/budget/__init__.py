"""Cost-aware budgets: a machine's measured verify cost per tree size (profile.py) and how it is measured (measure.py, experts.py), which graft_auto and eagle3_auto choose their node budget from."""
