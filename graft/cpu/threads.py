"""How many CPU threads a run uses and whether its OpenMP workers spin, chosen from the cores actually free.

A decode step on the CPU is hundreds of small operations; OpenMP workers that spin between them (a high
GOMP_SPINCOUNT) save the wake-up after each, which pays when every core is ours. With a busy neighbour
the spinning workers fight it for the cores and a step waits on whichever worker was descheduled, so
a step slows several-fold under one competing process. The policy: sample how busy the cores this
process may run on are (/proc/stat over a short window); when they are idle, one thread per core and
spinning workers; when some are busy, one thread per free core (at least one) and workers that sleep.
OpenMP reads the spin setting when torch loads, so `choose_before_torch()` runs first in run.py and the
thread count is applied after the model loads (`hardware.num_threads` set explicitly wins).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

SPIN = "100000000"  # GOMP_SPINCOUNT that keeps workers spinning between the small ops of a step
BUSY_CORE = 0.5  # a core more than half busy with other work is not ours


@dataclass(frozen=True)
class ThreadPolicy:
    cores: int  # cores this process may run on (its affinity)
    busy: float  # cores' worth of other work measured on them
    threads: int
    spin: bool
    reason: str

    def as_record(self) -> dict:
        return {"cores": self.cores, "busy_cores": round(self.busy, 2), "threads": self.threads, "spin": self.spin}


def choose(cores: int, busy: float) -> ThreadPolicy:
    """The policy for `cores` available cores with `busy` cores' worth of other work on them."""
    cores = max(1, cores)
    busy = min(max(busy, 0.0), float(cores))
    if busy < BUSY_CORE:
        return ThreadPolicy(cores, busy, cores, True, "cores idle: one spinning thread per core")
    free = max(1, math.floor(cores - busy + (1 - BUSY_CORE)))
    return ThreadPolicy(
        cores, busy, free, False, f"{busy:.1f} of {cores} cores busy: {free} thread(s) that sleep between ops"
    )


def _cpu_times(cpus: set[int]) -> tuple[float, float]:
    """(busy, total) jiffies summed over `cpus` from /proc/stat."""
    busy = total = 0.0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                continue
            values = [float(v) for v in fields[:8]]
            idle = values[3] + values[4]  # idle + iowait
            total += sum(values)
            busy += sum(values) - idle
    return busy, total


def measure_busy(window: float = 0.25) -> tuple[int, float]:
    """(cores this process may use, cores' worth of other processes' work on them over `window` seconds).
    Falls back to (os.cpu_count(), 0.0) where /proc/stat is unreadable."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1, 0.0
    try:
        own_before = time.process_time()
        busy0, total0 = _cpu_times(cpus)
        time.sleep(window)
        busy1, total1 = _cpu_times(cpus)
        own = time.process_time() - own_before
    except (OSError, ValueError):
        return len(cpus), 0.0
    if total1 <= total0:
        return len(cpus), 0.0
    share = (busy1 - busy0) / (total1 - total0)  # busy fraction of all listed cores
    others = share * len(cpus) - own / window  # minus this process's own work
    return len(cpus), max(0.0, others)


CHOSEN: ThreadPolicy | None = None  # what choose_before_torch() decided in this process
HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"  # torch's CPU allocator: 2 MB-aligned large blocks, madvise(MADV_HUGEPAGE)


def prefer_huge_pages(environ=os.environ) -> None:
    """Ask torch's CPU allocator for transparent huge pages (unless the user set it): a decode step streams
    every weight once, and with 4 KB pages that is a TLB miss per page. Where THP is in madvise mode only
    memory asked for this way gets huge pages (docs/cpu_engine.md has what it saved)."""
    environ.setdefault(HUGE_PAGES, "1")


def huge_pages_mb() -> float | None:
    """This process's anonymous memory in transparent huge pages, MB (None where Linux does not say)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            line = next((line for line in f if line.startswith("AnonHugePages:")), None)
    except OSError:
        return None
    return None if line is None else int(line.split()[1]) / 1024


def choose_before_torch(environ=os.environ) -> ThreadPolicy | None:
    """Measure, decide, and set the OpenMP spin policy in `environ` before torch loads libgomp (and ask for
    huge pages, prefer_huge_pages). None when the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY themselves
    (their choice stands) or GRAFT_THREADS=fixed."""
    prefer_huge_pages(environ)
    if environ.get("GRAFT_THREADS") == "fixed" or "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return None
    global CHOSEN
    policy = CHOSEN = choose(*measure_busy())
    if policy.spin:
        environ["GOMP_SPINCOUNT"] = SPIN
    else:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        environ["GOMP_SPINCOUNT"] = "0"
    return policy


def apply(num_threads: int | None) -> None:
    """Set torch's thread count: `num_threads` when given, else the chosen policy's (if one was chosen)."""
    import torch

    if num_threads:
        torch.set_num_threads(num_threads)
    elif CHOSEN is not None:
        torch.set_num_threads(CHOSEN.threads)
