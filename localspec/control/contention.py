"""Whether the machine is busy enough that timings taken now are unreliable: other programs
running on the cores (load above the core count, or a thread that asks for the CPU getting
much less of it than the wall clock), or a single step that timed very differently twice."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from localspec.core.protocol import Capabilities

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


# -- llama.cpp's thread count on a shared machine -----------------------------------------------
#
# llama.cpp's workers (OpenMP's, or its own pool) spin at every barrier of a pass until the
# slowest arrives, so one worker that loses its core to another program stalls all of them: on
# a busy 2-core machine two threads decoded at 4 tok/s where one thread made 56 (issue 56).
# Hence the default takes only the cores other programs leave free, and a warning says when a
# runtime's threads and everything else together want more cores than there are.

BUSY_SAMPLE_SECONDS = 0.1  # how long the default's look at the machine takes, once per load


def busy_cores(seconds: float = BUSY_SAMPLE_SECONDS) -> float:
    """How many logical cores are busy over the next `seconds`, while this thread waits: what
    other programs (and this one's other threads) keep running."""
    import psutil

    return float(psutil.cpu_percent(interval=seconds)) / 100 * (os.cpu_count() or 1)


def default_threads(physical: int, logical: int, busy: float) -> int:
    """llama.cpp's threads when none is asked for: one per physical core (hyper-threads share a
    core's vector units), but no more than the logical cores `busy` leaves free; at least one."""
    return max(1, min(physical, round(logical - busy)))


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has none: nothing to warn from
        return 0.0


def oversubscribed(threads: int) -> str | None:
    """Why `threads` llama.cpp threads are too many now (the 1-minute load average, which counts
    them, above the logical cores), or None: one thread has no barrier to wait at."""
    cores, load = os.cpu_count() or 1, load_average()
    if threads <= 1 or load <= cores:
        return None
    return (
        f"the machine is oversubscribed (load {load:.1f} on {cores} cores, {threads} llama.cpp threads here): "
        "its threads wait for each other whenever another program takes a core, which can make decoding "
        "several times slower than one thread"
    )


def threads_notice(capabilities: Capabilities, fix: str = "load with threads=1") -> str | None:
    """For a request's stats, or a command's note: the oversubscription of a model on this
    machine's CPU, and the fix (the API's; a command passes its flag)."""
    threads = capabilities.extra.get("threads", "")
    if capabilities.device != "cpu" or not threads.isdigit():
        return None
    why = oversubscribed(int(threads))
    return None if why is None else f"{why}; {fix} (or stop the other programs)"
