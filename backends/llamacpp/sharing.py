"""Which of the lanes' waiting blocks share the next pass (lanes.py): the oldest, and beside
it the blocks that make the pass worth most real rows per second on the cost curve."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from itertools import pairwise
from typing import Generic, Protocol, TypeVar

from . import compute


class Block(Protocol):
    """A lane's block waiting for a pass (lanes._Ask)."""

    @property
    def tokens(self) -> list[int]: ...

    @property
    def alone(self) -> bool: ...


B = TypeVar("B", bound=Block)

# A busy lane that has not asked for its next block this long after another did is doing
# host work (a stop string, a slow client) or has ended without saying so: the pass runs
# without it rather than hold the others.
STRAGGLER_SECONDS = 0.02


def next_pass(pending: Sequence[B], row_limit: int, cost: Callable[[int], float], equal_only: bool) -> list[B]:
    """The blocks of the next pass, pending[0] first. A pass is as wide as its widest block
    (narrower ones are padded), so for each width it could have, it takes the blocks of that
    width and the narrower ones whose padding costs less than their share of a pass of their
    own; the rest wait. Of those shapes it runs the one that serves every waiting block
    soonest, the rest counted in passes of their own width after it: the oldest block padded
    into a wide draft's pass is dear where a pass costs its rows (a CPU), cheap where rows
    cost little (a GPU). equal_only: no padding (a model with recurrent state, which padding
    rows would move), so only blocks as wide as the first share its pass."""
    first = pending[0]
    if first.alone or len(first.tokens) > row_limit:  # alone, as a lone request evaluates it
        return [first]
    shared = [a for a in pending if not a.alone]
    if equal_only:
        widths = [len(first.tokens)]
    else:
        widths = sorted({len(a.tokens) for a in shared if len(first.tokens) <= len(a.tokens) <= row_limit})
    best: tuple[float, list[B]] = (float("inf"), [first])
    for width in widths:
        chosen = _at_width(first, width, shared, row_limit, cost, equal_only)
        rest = [a for a in shared if a not in chosen]
        seconds = cost(width * len(chosen)) + _own_passes(rest, row_limit, cost)
        if seconds < best[0]:
            best = (seconds, chosen)
    return best[1]


def _own_passes(blocks: Sequence[B], row_limit: int, cost: Callable[[int], float]) -> float:
    """The seconds to serve blocks in passes of one width each (no padding), as many a pass as
    the row limit holds."""
    seconds = 0.0
    for width in {len(b.tokens) for b in blocks}:
        count, room = sum(1 for b in blocks if len(b.tokens) == width), max(row_limit // width, 1)
        full, part = divmod(count, room)
        seconds += full * cost(width * room) + (cost(width * part) if part else 0.0)
    return seconds


def _at_width(
    first: B, width: int, shared: list[B], row_limit: int, cost: Callable[[int], float], equal_only: bool
) -> list[B]:
    """A pass `width` rows a lane, holding `first`: the blocks of that width, then (unless
    equal_only) narrower ones where padding them costs less than their share of a pass of
    their own (of the blocks that may share a pass)."""
    room = row_limit // width
    same = [a for a in shared if a is not first and len(a.tokens) == width]
    chosen = [first, *same[: room - 1]]
    if equal_only:
        return chosen
    for block in shared:
        if len(chosen) >= room or block in chosen or len(block.tokens) > width:
            continue
        narrow = [a for a in shared if len(a.tokens) == len(block.tokens) and a not in chosen]
        own_share = cost(len(narrow) * len(block.tokens)) / len(narrow)
        if cost((len(chosen) + 1) * width) - cost(len(chosen) * width) <= own_share:
            chosen.append(block)
    return chosen


def gaps_to_fill(seqs: Sequence[int], width: int, row_limit: int, cost: Callable[[int], float]) -> list[int]:
    """The sequences missing between a pass's (ascending) that should join it with `width`
    padding rows each. llama.cpp evaluates separate streams together only in consecutive order
    (split_equal), so lanes 0 and 2 alone run as two passes: where one pass over the whole span
    costs less than those (and stays within the rows the kernels keep exact), the lanes between
    are filled. On the 2-core Xeon, a plain step of lanes 0, 2 and 3 took 31.6 ms split and 27.7
    filled (benchmarks/results/2026-12-02-xeon-amx/lane_gaps_plain.md)."""
    span = seqs[-1] - seqs[0] + 1
    if span == len(seqs) or span * width > row_limit:
        return []
    breaks = [i for i in range(1, len(seqs)) if seqs[i] != seqs[i - 1] + 1]
    edges = [0, *breaks, len(seqs)]  # llama.cpp's passes: the runs of consecutive sequences
    if cost(span * width) >= sum(cost((end - start) * width) for start, end in pairwise(edges)):
        return []
    present = set(seqs)
    return [seq for seq in range(seqs[0], seqs[-1] + 1) if seq not in present]


class Ask(Protocol):
    """A lane's ask waiting for a pass: since when, and whether its pass has run."""

    since: float
    done: bool
    error: BaseException | None


A = TypeVar("A", bound=Ask)
R = TypeVar("R")


class PassTurns(Generic[A]):
    """Asks that wait for a pass under the lanes' lock (`cond`), one of their threads leading
    each pass once it is ready (_ready) and running it on the compute thread with the lock let
    go (llama_decode lets go of the GIL too, so the other lanes' host work goes on meanwhile):
    the lanes' shared passes (lanes.py) and their assistants' (head_passes.py)."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._pending: list[A] = []
        self._running = False

    def _ready(self) -> bool:
        """Whether a pass runs now (the lock held)."""
        raise NotImplementedError

    def _take(self) -> list[A]:
        """The next pass's asks, taken out of those waiting (the lock held)."""
        raise NotImplementedError

    def _run(self, asks: list[A]) -> None:
        """The pass over asks, on the compute thread; an ask that cannot be served gets an error."""
        raise NotImplementedError

    def _await(self, ask: A) -> None:
        """Ask in line (the lock held), then its pass run, by this thread or another."""
        self._pending.append(ask)
        self._cond.notify_all()
        while not ask.done:
            if not self._running and self._ready():
                self._lead()
            else:
                self._cond.wait(STRAGGLER_SECONDS / 2)

    def _oldest_waited(self) -> bool:
        """Whether the oldest ask has waited a straggler's limit (the lock held)."""
        return time.perf_counter() - self._pending[0].since >= STRAGGLER_SECONDS

    def _lead(self) -> None:
        asks = self._take()
        try:
            self._in_flight(partial(self._run, asks))
        finally:
            for ask in asks:  # the waiters woken see it once this thread lets the lock go
                ask.done = True

    def _in_flight(self, fn: Callable[[], R]) -> R:
        """fn on the compute thread as the one pass in flight: the lock held on entry and on
        return, let go meanwhile; no other pass starts until it returns (_settled waits)."""
        self._running = True
        self._cond.release()
        try:
            return compute.run_there(fn)
        finally:
            self._cond.acquire()
            self._running = False
            self._cond.notify_all()

    def _settled(self) -> None:
        """Wait until no pass is in flight (the lock held)."""
        while self._running:
            self._cond.wait()

    def _refuse_waiting(self, error: BaseException) -> None:
        """Every ask still waiting ends with error (the lock held: closing)."""
        for ask in self._pending:
            ask.error, ask.done = error, True
        self._pending.clear()
        self._cond.notify_all()
