"""The decode loop's clock: marks at phase boundaries, turned into seconds once per sequence.

On a CPU a mark is the host's perf_counter. On CUDA kernels run asynchronously, so the host's clock at a
phase boundary is only when the phase was queued; there a mark is a CUDA event recorded on the stream, and
the events are read back once, after the sequence (hardware.timing=auto). hardware.timing=sync instead
synchronises every device at each mark (exact per phase, at the price of a host sync per mark), and
timing=async uses the host's clock without synchronising (the split between phases is then approximate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch


class StepMarks(NamedTuple):
    """A step's marks at its phase boundaries (host seconds, or CUDA events)."""

    start: object
    drafted: object
    topology_built: object
    verified: object
    committed: object  # acceptance decided and the cache committed
    extended: object  # the drafter updated from the verification
    end: object


@dataclass
class StepTimes:
    """A sequence's seconds: the prefill, the whole, and per step the split every record carries. Draft is the
    drafter's two phases (propose, and update after the verification), verify the target's forward, other the
    rest of the step (topology, acceptance, commit, the loop's own work)."""

    prefill_s: float
    wall_s: float
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    other_s: list[float] = field(default_factory=list)


class PhaseClock:
    def __init__(self, devices: list[torch.device], mode: str = "host", device: torch.device | None = None):
        """mode: "host" (perf_counter), "sync" (perf_counter after synchronising `devices`) or "events"
        (recorded on `device`'s stream: a sharded model's last GPU, which finishes each phase last)."""
        self.cuda = [d for d in devices if d.type == "cuda"]
        self.mode = "host" if mode == "events" and not self.cuda else mode
        self.stream = torch.cuda.current_stream(device or self.cuda[-1]) if self.mode == "events" else None

    def mark(self):
        if self.mode == "events":
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)
            return event
        if self.mode == "sync":
            for device in self.cuda:
                torch.cuda.synchronize(device)
        return time.perf_counter()

    def seconds(self, marks: list) -> list[float]:
        """Each mark's time in seconds after the first one; with events, one wait for the last."""
        if self.mode != "events":
            return [m - marks[0] for m in marks]
        marks[-1].synchronize()
        return [marks[0].elapsed_time(m) / 1e3 for m in marks]

    def step_times(self, start, prefilled, steps: list[StepMarks], end) -> StepTimes:
        """The sequence's StepTimes from its marks: `start` before the prefill, `prefilled` after it, each
        step's seven marks (StepMarks) and `end`; read back once (`seconds`)."""
        seconds = self.seconds([start, prefilled, *(m for step in steps for m in step), end])
        times = StepTimes(prefill_s=seconds[1], wall_s=seconds[-1])
        width = len(StepMarks._fields)
        for i in range(len(steps)):
            at = StepMarks(*seconds[2 + width * i : 2 + width * (i + 1)])
            draft_s = (at.drafted - at.start) + (at.extended - at.committed)
            verify_s = at.verified - at.topology_built
            times.draft_s.append(draft_s)
            times.verify_s.append(verify_s)
            times.other_s.append(at.end - at.start - draft_s - verify_s)
        return times
