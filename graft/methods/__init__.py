"""The paper's side of the comparison: model drafters and tree builders. Importing registers them."""

from graft.methods import eagle3, graft, pruned  # noqa: F401
