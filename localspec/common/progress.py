"""Says what a slow step is doing: announced() for one before the first token (loading a
model, deriving a self-drafter), one line and only once the step has taken SLOW_SECONDS, so a
fast load prints nothing; Steps for a command made of long steps (doctor, bench), a counter."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

SLOW_SECONDS = 2.0
DETAIL_SECONDS = 5.0  # Steps in a log: how often a step's progress may add a line


class LoadProgress(str):
    """What load()'s on_progress receives: the line a CLI prints ("fetching the default model
    SmolLM2-135M-Instruct.Q4_1.gguf: 40 of 89 MiB"), as a str, with its parts: step (what is
    going on), detail (how far it has got, "" when not said) and fraction (0 to 1, for a
    progress bar; None while unknown). A str, so a callback that prints it needs no change."""

    step: str
    detail: str
    fraction: float | None

    def __new__(cls, step: str, detail: str = "", fraction: float | None = None) -> LoadProgress:
        self = super().__new__(cls, f"{step}: {detail}" if step and detail else step or detail)
        self.step, self.detail, self.fraction = step, detail, fraction
        return self


def fraction_of(text: str) -> float | None:
    """The fraction done that a report carries (None for a plain string)."""
    return text.fraction if isinstance(text, LoadProgress) else None


# Called with what is going on (a LoadProgress, which is a str), from a timer thread for a
# step's first line and from the loading thread for its details.
Announce = Callable[[str], None]


# How far the step under way has got ("40 of 120 MiB written"), for whoever announces it.
_reporter: ContextVar[Callable[[str], None] | None] = ContextVar("localspec_progress", default=None)


def report(detail: str, fraction: float | None = None) -> None:
    """Say how far the step under way has got, and the fraction done if known; nothing when
    no one listens."""
    listener = _reporter.get()
    if listener is not None:
        listener(LoadProgress("", detail, fraction) if fraction is not None else detail)


def reporter() -> Callable[[str], None]:
    """report() bound to this thread's listener, for a helper thread to call."""
    listener = _reporter.get()
    return listener if listener is not None else lambda detail: None


@contextmanager
def reporting(to: Callable[[str], None]) -> Iterator[None]:
    """report() within the block calls `to`."""
    token = _reporter.set(to)
    try:
        yield
    finally:
        _reporter.reset(token)


@contextmanager
def stage(what: str) -> Iterator[None]:
    """report(what) now; a report(detail) within the block is said as f"{what}, {detail}"."""
    outer = reporter()
    outer(what)
    with reporting(lambda detail: outer(LoadProgress("", f"{what}, {detail}", fraction_of(detail)))):
        yield


@contextmanager
def announced(what: str, announce: Announce | None, after: float = SLOW_SECONDS) -> Iterator[None]:
    """Runs the block; calls announce(LoadProgress(what)) if it is still running `after`
    seconds in, and then announce(LoadProgress(what, detail, fraction)) for each report the
    block makes."""
    if announce is None:
        yield
        return
    shown = threading.Event()

    def show() -> None:
        shown.set()
        announce(LoadProgress(what))

    def tell(detail: str) -> None:
        if shown.is_set():
            announce(LoadProgress(what, str(detail), fraction_of(detail)))

    timer = threading.Timer(after, show)
    timer.daemon = True
    timer.start()
    try:
        with reporting(tell):
            yield
    finally:
        timer.cancel()


class Steps:
    """A counter on stderr for a command whose steps take long: "localspec doctor [2/4]
    timing the model's passes… 14 s". On a terminal it is one line, rewritten in place each
    second and cleared at the end, so stdout's answer is never interleaved with it; written to
    a file or a pipe, each step is one line of its own (a log stays readable)."""

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_terminal(self.stream)
        self.done = 0
        self._what = ""
        self._detail = ""
        self._started = time.monotonic()
        self._printed = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def step(self, what: str) -> None:
        """The next step begins."""
        with self._lock:
            self.done += 1
            self._what, self._detail, self._started = what, "", time.monotonic()
            self._printed = self._started
            self._write(final=not self.live)
        if self.live and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def detail(self, text: str) -> None:
        """How far the current step has got: shown in place on a terminal; in a log, at most
        one line every DETAIL_SECONDS."""
        with self._lock:
            now = time.monotonic()
            if not self.live and now - self._printed < DETAIL_SECONDS:
                self._detail = text
                return
            self._detail, self._printed = text, now
            self._write(final=not self.live)

    def say(self, text: str) -> None:
        """An Announce: "what" starts a step, "what: detail" says how far it has got."""
        what, _, detail = text.partition(": ")
        if what != self._what or not detail:
            self.step(what)
        if detail:
            self.detail(detail)

    def note(self, text: str) -> None:
        """A line that stays (a finding along the way), above the counter."""
        with self._lock:
            self._clear()
            print(f"{self.label}: {text}", file=self.stream, flush=True)
            if self.live and self._what:
                self._write(final=False)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self._ticker, self._stop = None, threading.Event()  # a later step starts ticking again
        with self._lock:
            self._clear()
            self._what = ""

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        count = f" [{self.done}/{self.total}]" if self.total else ""
        elapsed = time.monotonic() - self._started
        seconds = f" {elapsed:.0f} s" if self.live and elapsed >= 1 else ""
        detail = f": {self._detail}" if self._detail else ""
        return f"{self.label}{count} {self._what}{detail}…{seconds}"

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self._what:
                    self._write(final=False)

    def _write(self, final: bool) -> None:
        if final:
            print(self.line(), file=self.stream, flush=True)
        else:
            self.stream.write(f"\r\033[K{self.line()}")
            self.stream.flush()

    def _clear(self) -> None:
        if self.live and self._what:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
