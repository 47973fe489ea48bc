"""A cost model of speculative decoding: what a method's speedup would be, from its acceptance records and a
device's measured costs.

Each step a drafter proposes a tree of N nodes (root included), the target verifies all N in one forward,
and the step commits `accepted` tokens (accepted nodes + the bonus token). The autoregressive baseline
verifies 1 node and commits 1 token per step. So

    ms per committed token = sum over steps (draft + verify(N, context) + overhead(N)) / sum(accepted)
    AR ms per committed token = mean over the same tokens of (draft_ar + verify(1, context) + overhead(1))
    projected speedup = AR ms per token / the method's

which is the projection of `speedup_decode` (graft/records/metrics.py: baseline seconds per step token over the
method's, prefill excluded): the same tokens, timed by a profile instead of by the run.

A `CostProfile` holds verify(N, context) as a table measured by `python -m graft.costmodel profile` on one
device, the per-step overhead of the decode loop (topology, acceptance, cache commit, bookkeeping: it grows
with N, and moving an accepted path in the cache adds to it) and, where measured, each drafter's ms per step.
A projection is a model: it replays recorded acceptance (which does not depend on the device) against costs
measured elsewhere; it is not a run. A profile measured at batch B (profile --batch B) costs each step as a
sequence's share of a batched step, verify_B(N) / B, against batched AR at B (docs/cost_model.md "At batch B").
Pure functions: no torch, and no import of the CPU engine (graft.methods reads this module;
tests/harness/test_structure.py keeps the core off graft.cpu).

The commands (`python -m graft.costmodel <command>`, graft/costmodel/__main__.py):
- profile (profile.py): measure a device's CostProfile;
- project (project.py): projected speedups of recorded runs beside the measured ones;
- forward (forward.py): the target forward's cost per fast path: bandwidth and compute roofs, verify times.
"""
