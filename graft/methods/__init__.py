"""The paper's side of the comparison: draft sources, budget splits and grafting policies.
`graft.registry.discover()` imports every module here."""
