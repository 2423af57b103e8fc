"""Who holds a runtime: the one owner of its concurrency. One request runs at a time; the
others wait in the order they asked (a fair queue), for at most their timeout. Stopping a
request (close() from any thread, a new call in the reader's own thread, the runtime's close())
halts it at its next prompt chunk or step, and its reader still gets the request's last event.

A request's events come from a generator that polls its Turn's `stopping()` and, once halted,
ends with its last event at once; the runtime (localspec.runtime) makes those events, this
module knows nothing about models. Async callers read a request through AsyncStream, whose
thread does the waiting, so an event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from localspec.core.errors import BackendClosedError, InvalidRequestError, RuntimeBusyError

E = TypeVar("E")

# Why a request ended early, as its last event says.
CANCELLED = "cancelled"  # close(), the runtime's close(), a cancel Event or task.cancel()
PREEMPTED = "preempted"  # a new call in the thread that holds the unfinished request


@dataclass(eq=False)
class Turn(Generic[E]):
    """One request: its events (None for a call that just holds the runtime, like remember()),
    the thread that asked and then the one that last read it, the thread inside it now, why it
    was halted, and the events made for its reader after it was halted."""

    events: Generator[E, None, None] | None = None
    thread: int = 0
    busy: int | None = None  # the thread inside next(), a drain or remember(): wait for it
    halted: str | None = None
    over: bool = False  # it no longer holds (or waits for) the runtime
    pending: deque[E] = field(default_factory=deque)

    def stopping(self) -> bool:
        """Whether the request was asked to stop: its generator ends at the next check."""
        return self.halted is not None


class Withdrawn(Exception):
    """A request halted while it waited for the runtime: it never ran (AsyncStream's cancel)."""


class Turns(Generic[E]):
    """The runtime's one lock and its queue. `last` says which event ends a request."""

    def __init__(self, last: Callable[[E], bool]) -> None:
        self._last = last
        # Held only to read or change the state below, never during a step, so busy and
        # halt() answer at once from a UI thread; reentrant, as the collector may free (and so
        # close) a dropped stream inside any allocation, this lock held or not.
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque[Turn[E]] = deque()  # waiting requests, first come first served
        self._owner: Turn[E] | None = None
        self._closing = False

    @property
    def busy(self) -> bool:
        """Whether a request holds the runtime or waits for it: a new call would wait."""
        with self._cond:
            return self._owner is not None or bool(self._queue)

    @property
    def waiting(self) -> int:
        """How many requests wait for the runtime behind the one that holds it."""
        with self._cond:
            return len(self._queue)

    def check_open(self) -> None:
        if self._closing:
            raise BackendClosedError("this runtime was closed", "load the model again with localspec.load()")

    # -- taking the runtime -------------------------------------------------------------------

    def take(self, turn: Turn[E], timeout: float | None = None) -> None:
        """Wait in line for the runtime and hold it (a turn without events is busy until
        release()). A request of this thread that is open but not being read is halted first
        (PREEMPTED), as this thread cannot be reading it; RuntimeBusyError after timeout seconds."""
        me = threading.get_ident()
        turn.thread = me
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            self.check_open()
            self._queue.append(turn)
        try:
            while (mine := self._wait_in_line(turn, me, deadline)) is not None:
                self.stop(mine, PREEMPTED)
        except BaseException:
            with self._cond:
                if turn in self._queue:
                    self._queue.remove(turn)
                turn.over = True
                self._cond.notify_all()  # the next in line may be first now
            raise

    def _wait_in_line(self, turn: Turn[E], me: int, deadline: float | None) -> Turn[E] | None:
        """Wait until the turn holds the runtime (None), or return this thread's own open
        request, which the caller halts before waiting on."""
        with self._cond:
            while True:
                if turn.halted is not None:
                    raise Withdrawn(turn.halted)
                self.check_open()
                owner = self._owner
                if owner is None and self._queue[0] is turn:
                    self._queue.popleft()
                    self._owner = turn
                    turn.busy = me if turn.events is None else None
                    return None
                if owner is not None and owner.thread == me:
                    if owner.busy == me:
                        raise InvalidRequestError(
                            "a request cannot start inside another one in the same thread",
                            "finish or close the running stream first, or start the request from another thread",
                        )
                    if owner.busy is None:
                        return owner
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeBusyError(
                        f"the runtime is still busy with another request ({len(self._queue) - 1} more waiting)",
                        "pass a longer timeout=, check runtime.busy before asking, "
                        "or stop the running request with its stream's close()",
                    )
                self._cond.wait(left)

    def release(self, turn: Turn[E]) -> None:
        """End a turn without events (remember()) in the thread that took it."""
        with self._cond:
            turn.busy = None
            self._finish(turn)

    # -- reading ------------------------------------------------------------------------------

    def next(self, turn: Turn[E]) -> E:
        """The request's next event; the turn ends with its last event, an error or Ctrl+C."""
        me = threading.get_ident()
        with self._cond:
            while turn.busy is not None and turn.halted is not None and turn.busy != me:
                self._cond.wait()  # another thread drains it: its last event comes next
            if turn.pending:
                return turn.pending.popleft()
            if turn.over or turn.events is None:
                raise StopIteration
            if turn.busy is not None:
                raise InvalidRequestError(
                    "this stream is already being read by another thread", "read a stream from one thread at a time"
                )
            turn.busy = turn.thread = me
            events = turn.events
        try:
            event = next(events)
            last = self._last(event)
            if last:
                events.close()  # runs the request's bookkeeping now, not at the caller's next call
        except BaseException:  # StopIteration, an error or KeyboardInterrupt: the generator is done
            with self._cond:
                turn.busy = None
                self._finish(turn)
            raise
        with self._cond:
            turn.busy = None
            if last:
                self._finish(turn)
            else:
                self._cond.notify_all()  # a close() from another thread waits for this step
        return event

    # -- stopping -----------------------------------------------------------------------------

    def halt(self, turn: Turn[E], reason: str = CANCELLED) -> None:
        """Ask a request to stop, without waiting: a waiting one leaves the line (its take()
        raises Withdrawn), a running one ends at its next chunk or step. Safe on an event loop."""
        with self._cond:
            if turn.halted is None:
                turn.halted = reason
            if turn in self._queue:
                self._queue.remove(turn)
                turn.over = True
            self._cond.notify_all()

    def stop(self, turn: Turn[E], reason: str = CANCELLED, deliver: bool = True) -> None:
        """Halt a request and wait until it has released the runtime: after the step another
        thread has in flight, this thread runs it to its last event, which its reader gets
        next (deliver False: nobody reads it, its generator is just closed)."""
        me = threading.get_ident()
        with self._cond:
            if turn.busy == me:
                raise InvalidRequestError(
                    "a stream cannot be closed from inside its own step", "close it once the event is returned"
                )
            if turn.halted is None:
                turn.halted = reason
            if turn in self._queue:
                self._queue.remove(turn)
                turn.over = True
            while turn.busy is not None and not turn.over:
                self._cond.wait()
            if turn.over:
                return
            turn.busy = me
        self._drain(turn, deliver)

    def _drain(self, turn: Turn[E], deliver: bool) -> None:
        """Run a halted request to its last event (quick: it stops at its first check)."""
        made: list[E] = []
        try:
            if turn.events is not None and deliver:
                for event in turn.events:
                    made.append(event)
                    if self._last(event):
                        break
            if turn.events is not None:
                turn.events.close()
        finally:
            with self._cond:
                turn.pending.extend(made)
                turn.busy = None
                self._finish(turn)

    def close(self) -> bool:
        """Stop the running request (its reader gets its last event), refuse the waiting ones
        (BackendClosedError) and every later call. False if it was closed already."""
        with self._cond:
            owner = self._owner
            if owner is not None and owner.busy == threading.get_ident():
                raise InvalidRequestError(
                    "a runtime cannot be closed from inside one of its own steps", "close it once the event is returned"
                )
            if self._closing:
                return False
            self._closing = True
            self._cond.notify_all()  # the waiting requests wake to their BackendClosedError
        while owner is not None:
            self.stop(owner)
            with self._cond:
                owner = self._owner
        return True

    def _finish(self, turn: Turn[E]) -> None:
        """Release the runtime from a turn that is over (the lock held)."""
        turn.over = True
        turn.events = None  # frees the request's frames now
        if self._owner is turn:
            self._owner = None
        self._cond.notify_all()


class TurnStream(Generic[E]):
    """One request's events, holding the runtime until its last event; see Runtime.stream()."""

    def __init__(self, turns: Turns[E], turn: Turn[E]) -> None:
        self._turns = turns
        self._turn = turn

    def __iter__(self) -> TurnStream[E]:
        return self

    def __next__(self) -> E:
        return self._turns.next(self._turn)

    def close(self) -> None:
        """Stop the request and release the runtime, from any thread: a reader in another
        thread gets the step it has in flight, then the last event (finish reason
        "cancelled"); this thread's next read gets that last event. Closing twice is harmless."""
        self._turns.stop(self._turn, CANCELLED)

    def __enter__(self) -> TurnStream[E]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._turn.over:
            self._turns.stop(self._turn, CANCELLED, deliver=False)


_END = object()  # after the last item the pump sends


class AsyncStream(Generic[E]):
    """A request read by a thread of its own, as an async iterator: waiting for the runtime
    and each step happen in that thread, so the event loop runs on. Cancelling the task that
    reads it (or aclose(), or leaving `async with`) halts the request: it leaves the line if
    it waits, or ends at its next chunk or step."""

    def __init__(self, turns: Turns[E], start: Callable[[Turn[E]], None]) -> None:
        """start(turn): check the request, give the turn its events and take() it (in the
        pump thread, as it may wait)."""
        self._turns = turns
        self._start = start
        self._turn: Turn[E] = Turn()
        self._items: asyncio.Queue[object] | None = None
        self._done = False

    def __aiter__(self) -> AsyncStream[E]:
        return self

    async def __anext__(self) -> E:
        if self._done:
            raise StopAsyncIteration
        if self._items is None:
            self._items = asyncio.Queue()
            loop = asyncio.get_running_loop()
            threading.Thread(target=self._pump, args=(loop, self._items), daemon=True, name="localspec-astream").start()
        try:
            item = await self._items.get()
        except BaseException:  # CancelledError: the task reading this was cancelled
            self._halt()
            raise
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.error
        return item  # type: ignore[return-value]  # an E: the pump sends events, _Failed or _END

    def _pump(self, loop: asyncio.AbstractEventLoop, items: asyncio.Queue[object]) -> None:
        def send(item: object) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody reads on
                self._turns.halt(self._turn)

        try:
            self._start(self._turn)
            stream = TurnStream(self._turns, self._turn)
            for event in stream:
                send(event)
        except Withdrawn:
            pass
        except BaseException as error:
            send(_Failed(error))
        send(_END)

    def _halt(self) -> None:
        self._done = True
        if not self._turn.over:
            self._turns.halt(self._turn)

    async def aclose(self) -> None:
        """Halt the request (if it has not ended) without waiting for it."""
        self._halt()

    async def __aenter__(self) -> AsyncStream[E]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._halt()

    def __del__(self) -> None:
        if not self._turn.over:
            self._turns.halt(self._turn)


@dataclass(frozen=True)
class _Failed:
    error: BaseException
