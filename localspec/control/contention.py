"""Whether the machine is busy enough that timings taken now are unreliable: other programs
running on the cores (load above the core count, or a thread that asks for the CPU getting
much less of it than the wall clock), or a single step that timed very differently twice."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

# A spinning thread that gets less than this share of the wall clock is being crowded out.
FAIR_SHARE = 0.75
# Two timings of the same step further apart than this factor were disturbed.
NOISY_FACTOR = 1.5


@dataclass(frozen=True)
class Contention:
    load: float  # the 1-minute load average (0 where the system has none)
    cores: int
    cpu_share: float  # of a spinning thread's wall time, the CPU time it got

    @property
    def busy(self) -> bool:
        return self.load > self.cores or self.cpu_share < FAIR_SHARE

    def describe(self) -> str:
        why = []
        if self.load > self.cores:
            why.append(f"load {self.load:.1f} on {self.cores} cores")
        if self.cpu_share < FAIR_SHARE:
            why.append(f"a thread got {self.cpu_share:.0%} of the CPU it asked for")
        return "; ".join(why) or f"load {self.load:.1f} on {self.cores} cores"


def sample(seconds: float = 0.2) -> Contention:
    """Spin one thread for `seconds` and see how much CPU it got; read the load average."""
    start_wall, start_cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() - start_wall < seconds:
        pass
    share = (time.thread_time() - start_cpu) / max(time.perf_counter() - start_wall, 1e-9)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return Contention(load, os.cpu_count() or 1, min(share, 1.0))


def busiest(samples: Sequence[Contention]) -> Contention | None:
    """The sample that says most that the machine was busy, if any does."""
    busy = [s for s in samples if s.busy]
    return min(busy, key=lambda s: (s.cpu_share, -s.load)) if busy else None


def noisy(first: float, second: float) -> bool:
    """Whether two timings of the same step disagree beyond what a quiet machine shows."""
    low, high = sorted((first, second))
    return low <= 0 or high / low > NOISY_FACTOR


def unreliable_note(why: str) -> str:
    return (
        f"the machine was busy while this was measured ({why}): these figures are unreliable; "
        "run it again when the machine is quiet"
    )
