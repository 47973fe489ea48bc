"""The experiment configuration: the typed sections Hydra composes and validates (experiment.py) and the model shapes they name (shapes.py)."""
