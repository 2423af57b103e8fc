"""Which request gets which lane: the one place a pool's requests are given runtimes, used by
an app's Pool.lane()/generate()/agenerate() and by the server's generation jobs alike.

- Fair: requests are served in the order they asked. The first in line takes a lane as soon
  as one is free, and nobody behind it goes first (a request that needs every lane holds
  the line until all are free).
- Prefix affinity: of the free lanes, a request takes the one whose cache holds the longest
  part of its prompt, so a conversation's next turn lands where its last one is cached. A
  request that keeps only the rows a fresh evaluation computes alike (reuse_prefix "exact",
  serve's default) counts those first: two lanes may hold the same system turn, computed by
  a long prompt's large block in one and by one-token passes in the other, and only one of
  them gives a short prompt or a long one its bits.
- Bounded: beyond `max_waiting` requests in line, a new one is refused (LineFullError) at
  once; a request that waits longer than its timeout leaves the line (RuntimeBusyError).

Lanes are granted eagerly, under one lock, whenever one is freed or a request arrives, so the
order does not depend on which thread wakes first. Passes shared by the lanes
(backends/llamacpp/lanes.py) and one runtime's own turn-taking (localspec/turns.py) are other
concerns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from localspec.core.choices import ReusePrefix
from localspec.core.errors import BackendClosedError, RuntimeBusyError

# What a lane's cache holds of a prompt's start: the tokens a request keeps with a fresh
# evaluation's bits, and all the tokens it shares (Engine.keeps).
Cached = Callable[[int, Sequence[int]], tuple[int, int]]


class LineFullError(RuntimeBusyError):
    """A request refused because `max_waiting` requests already wait for a lane."""

    def __init__(self, waiting: int, lanes: int) -> None:
        super().__init__(
            f"{waiting} requests already wait for the pool's {lanes} lanes",
            "retry later, allow a longer line (max_waiting), or load the pool with a larger parallel",
        )
        self.waiting = waiting


@dataclass(eq=False)
class Ticket:
    """One request's place in line, then the lane it was given. `prompt`: its token ids, for
    prefix affinity (None: any lane will do); `whole`: it needs every lane at once (a server
    loading another model in place of the served one)."""

    prompt: Sequence[int] | None = None
    whole: bool = False
    key: str | None = None  # whom the caller asks for (a server's model id), for its figures
    reuse: ReusePrefix = "any"  # how the request reuses a cache: "exact" weighs exact rows first
    lane: int | None = None  # given once granted; for a whole ticket, 0
    owner: Dispatcher | None = None  # whose line it is in, or whose lane it holds
    state: str = "new"  # then waiting, granted, left (freed or withdrawn) or refused
    error: BaseException | None = None  # why it left the line without a lane (closed)
    _granted: threading.Event = field(default_factory=threading.Event, repr=False)
    _hooks: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def waiting(self) -> bool:
        return self.state == "waiting"

    @property
    def running(self) -> bool:
        return self.state == "granted"

    def wait(self, timeout: float | None = None) -> int:
        """Its owner's wait(): the lane, once granted."""
        assert self.owner is not None, "enter() the ticket first"
        return self.owner.wait(self, timeout)

    def leave(self) -> None:
        """Free what it holds, or leave the line (nothing once it has left)."""
        if self.owner is not None:
            self.owner.withdraw(self)

    def _settle(self, state: str, lane: int | None = None, error: BaseException | None = None) -> None:
        self.state, self.lane, self.error = state, lane, error
        self._granted.set()
        for hook in self._hooks:
            hook()


class Dispatcher:
    """The lanes 0..lanes-1 of a pool and the line of requests waiting for them. A dispatcher
    of 0 lanes is a waiting room: its line is handed to a pool's dispatcher once one is loaded
    (hand_over)."""

    def __init__(self, lanes: int, cached: Cached | None = None, max_waiting: int | None = None) -> None:
        self.lanes = lanes
        self.max_waiting = max_waiting  # None: the line is not bounded
        self._cached = cached
        self._cond = threading.Condition()
        self._line: deque[Ticket] = deque()
        self._holders: dict[int, Ticket] = {}  # lane -> the ticket holding it
        self._closed = False

    # -- asking ----------------------------------------------------------------------------------

    def enter(self, ticket: Ticket, max_waiting: int | None = None) -> Ticket:
        """Put the ticket in line, granting it a lane now if one is free and nobody is ahead;
        never blocks. A ticket that would wait behind max_waiting others (this call's, else the
        dispatcher's) is refused: LineFullError."""
        limit = self.max_waiting if max_waiting is None else max_waiting
        with self._cond:
            if self._closed:
                raise _closed()
            if limit is not None and self._crowded() and len(self._line) >= limit:
                ticket.state = "refused"
                raise LineFullError(len(self._line), self.lanes)
            ticket.state, ticket.owner = "waiting", self
            self._line.append(ticket)
            self._grant()
        return ticket

    def wait(self, ticket: Ticket, timeout: float | None = None) -> int:
        """Block until the ticket holds a lane, and return it; after timeout seconds (None:
        as long as it takes) it leaves the line: RuntimeBusyError."""
        if not ticket._granted.wait(timeout):
            self.withdraw(ticket)  # or free the lane granted since: it came too late
            raise self._busy(timeout)
        return self._lane_of(ticket)

    async def await_lane(self, ticket: Ticket, timeout: float | None = None) -> int:
        """wait() for asyncio: the event loop runs on while the ticket waits. A cancelled
        task, or the timeout, takes the ticket out of line, or frees the lane it was just given."""
        loop = asyncio.get_running_loop()
        granted = loop.create_future()

        def done() -> None:
            if not granted.done():
                granted.set_result(None)

        def settle() -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: its task withdrew the ticket
                loop.call_soon_threadsafe(done)

        with self._cond:
            ticket._hooks.append(settle)
            if ticket._granted.is_set():
                granted.set_result(None)
        try:
            await asyncio.wait_for(granted, timeout)
        except asyncio.TimeoutError:
            self.withdraw(ticket)
            raise self._busy(timeout) from None
        except BaseException:
            self.withdraw(ticket)
            raise
        return self._lane_of(ticket)

    def take(self, prompt: Sequence[int] | None = None, timeout: float | None = None) -> Ticket:
        """enter() and wait() in one: a granted ticket, to leave() when done."""
        ticket = self.enter(Ticket(prompt))
        self.wait(ticket, timeout)
        return ticket

    def _busy(self, timeout: float | None) -> RuntimeBusyError:
        return RuntimeBusyError(
            f"all {self.lanes} runtimes were busy for {timeout} s",
            "wait longer (timeout=None waits), or load the pool with a larger parallel",
        )

    def _lane_of(self, ticket: Ticket) -> int:
        if ticket.error is not None:
            raise ticket.error
        if not ticket.running or ticket.lane is None:
            raise RuntimeBusyError("the request left the line before it could run", "ask again")
        return ticket.lane

    # -- leaving ---------------------------------------------------------------------------------

    def leave(self, ticket: Ticket) -> None:
        """Free the lane(s) the ticket holds, or take it out of line if it still waits."""
        self.withdraw(ticket)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take the ticket out of line (True), or free what it holds once granted (False)."""
        with self._cond:
            if ticket.waiting and ticket in self._line:
                self._line.remove(ticket)
                ticket._settle("left")
                self._grant()  # a whole ticket that left may unblock those behind it
                return True
            if ticket.running:
                for lane in [lane for lane, holder in self._holders.items() if holder is ticket]:
                    del self._holders[lane]
                ticket.state = "left"
                self._grant()
            return False

    def close(self, error: BaseException | None = None) -> None:
        """Refuse new tickets and send those waiting away with `error` (default: closed)."""
        with self._cond:
            self._closed = True
            while self._line:
                self._line.popleft()._settle("left", error=error or _closed())
            self._cond.notify_all()

    def hand_over(self, to: Dispatcher, whole: Callable[[Ticket], bool] = lambda ticket: ticket.whole) -> None:
        """Move this line, in its order, to the end of `to`'s (a waiting room's line to the pool
        loaded for it); whole(ticket) says which need every lane there."""
        with self._cond:
            moving = list(self._line)
            self._line.clear()
            self._cond.notify_all()
        with to._cond:
            for ticket in moving:
                ticket.whole, ticket.owner = whole(ticket), to
                to._line.append(ticket)
            to._grant()

    # -- what it holds -------------------------------------------------------------------------

    def tickets(self) -> tuple[list[Ticket], list[Ticket]]:
        """The tickets holding lanes (each once) and those waiting, in line order."""
        with self._cond:
            running = list({id(t): t for t in self._holders.values()}.values())
            return running, list(self._line)

    def wait_for(self, condition: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until condition() holds, checked whenever a lane is granted or freed."""
        with self._cond:
            return self._cond.wait_for(condition, timeout)

    # -- granting (the lock held) ----------------------------------------------------------------

    def _grant(self) -> None:
        """Give the first in line a lane while one fits it; the rest keep their order."""
        while self._line and self._grantable_now(self._line[0]):
            ticket = self._line.popleft()
            if ticket.whole:
                self._holders.update(dict.fromkeys(range(self.lanes), ticket))
                ticket._settle("granted", 0)
            else:
                lane = self._best_lane(ticket)
                self._holders[lane] = ticket
                ticket._settle("granted", lane)
        self._cond.notify_all()

    def _crowded(self) -> bool:
        """Whether a ticket entering now would wait (a waiting room counts as one lane)."""
        return bool(self._line) or len(self._holders) >= max(self.lanes, 1)

    def _grantable_now(self, ticket: Ticket) -> bool:
        """Whether the ticket, first in line, would be given lanes now."""
        if self.lanes == 0 or (self._line and self._line[0] is not ticket):
            return False
        return not self._holders if ticket.whole else len(self._holders) < self.lanes

    def _best_lane(self, ticket: Ticket) -> int:
        """The free lane caching the longest part of the ticket's prompt that the request
        keeps (the module says how); the lowest of equals."""
        free = [lane for lane in range(self.lanes) if lane not in self._holders]
        prompt, cached = ticket.prompt, self._cached
        if prompt is None or cached is None:
            return free[0]
        first = 1 if ticket.reuse == "exact" else -1  # (exact, shared) or (shared, exact)
        return max(free, key=lambda lane: (*cached(lane, prompt)[::first], -lane))


def _closed() -> BackendClosedError:
    return BackendClosedError("the pool was closed", "load it again to run more requests")
