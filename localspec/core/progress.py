"""Says what a slow step before the first token is doing (loading a model, deriving a
self-drafter): one line, and only once the step has taken SLOW_SECONDS, so a fast load
prints nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SLOW_SECONDS = 2.0

# Called with what is going on ("loading model.gguf"), from a timer thread.
Announce = Callable[[str], None]


@contextmanager
def announced(what: str, announce: Announce | None, after: float = SLOW_SECONDS) -> Iterator[None]:
    """Runs the block; calls announce(what) if it is still running `after` seconds in."""
    if announce is None:
        yield
        return
    timer = threading.Timer(after, announce, args=(what,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
