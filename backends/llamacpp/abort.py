"""Stopping a pass in flight: llama.cpp's abort callback, asked by the pass's first thread after
every graph node while a prompt piece runs, so a cancel lands within a node instead of after a
piece that can take 400 ms deep in a long context (issue 56). A stopped pass ends llama_decode
with code 2, and llama.cpp removes that pass's positions from the cache.

Installed only around the prompt's pieces: a decoding step's callback per node would cost a
call into Python (and the GIL) hundreds of times a step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import library

llama = library.llama

# llama.cpp's code for a pass its abort callback stopped.
ABORTED = 2


class Abort:
    """The abort callback of one llama.cpp context."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self._stop: Callable[[], bool] | None = None
        self._asked = False  # whether a stop was seen, so the pass it ends is known to be a stop
        self._callback = llama.ggml_abort_callback(self._ask)  # kept: llama.cpp holds its address
        self._none = llama.ggml_abort_callback()  # a NULL function pointer: no callback

    def _ask(self, _data: Any) -> bool:
        stop = self._stop
        if stop is not None and stop():
            self._asked = True
        return self._asked

    @contextmanager
    def when(self, stop: Callable[[], bool]) -> Iterator[None]:
        """Passes in this block end early once stop() says so."""
        self._stop, self._asked = stop, False
        llama.llama_set_abort_callback(self._ctx, self._callback, None)
        try:
            yield
        finally:
            llama.llama_set_abort_callback(self._ctx, self._none, None)
            self._stop = None

    def stopped(self, rc: int) -> bool:
        """Whether a pass that returned rc was ended by the stop."""
        return rc == ABORTED and self._asked
