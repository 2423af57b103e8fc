"""Checks on what a user hands in (text, numbers from the command line), shared by the CLI,
the API and the chat, so hostile input is refused at the edge with a message, not a traceback."""

from __future__ import annotations

import os
import select
import stat
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from localspec.core.errors import InvalidRequestError


def clean_text(text: str) -> str:
    """Text that encodes as UTF-8: bytes that were not UTF-8 (which Python carries as lone
    surrogates in argv, paths and stdin) become U+FFFD, as a text editor shows them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "replace")
        return raw.decode("utf-8", "replace")


def arg_text(value: str) -> str:
    """A command-line argument as text (argv holds undecodable bytes as surrogates)."""
    return clean_text(os.fsencode(value).decode("utf-8", "replace")) if value else value


def check_ctx(n_ctx: object) -> int:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise InvalidRequestError(
            f"the context length must be a whole number of 1 or more, got {n_ctx!r}",
            "use --ctx 4096 (the default), or leave it out",
        )
    return n_ctx


def check_threads(threads: object) -> int | None:
    """None or 0 mean "one per physical core that other programs leave free" (see
    localspec.control.contention.default_threads)."""
    if threads is None or threads == 0:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise InvalidRequestError(
            f"threads must be a whole number of 1 or more, got {threads!r}",
            "leave --threads out (or give 0) to use the physical cores other programs leave free",
        )
    return threads


# max_tokens=None: no cap of its own, so the answer runs until it ends or the context is full.
TO_THE_END = sys.maxsize


def check_limits(max_tokens: object, stop: object) -> tuple[int, tuple[str, ...]]:
    """A request's max_tokens (None: to the end of the context) and stop strings (one string,
    or a list of them)."""
    if max_tokens is None:
        max_tokens = TO_THE_END
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | np.integer):
        raise InvalidRequestError(
            f"max_tokens must be a whole number, got {max_tokens!r}", "or None: until the context is full"
        )
    if max_tokens < 0:
        raise InvalidRequestError(f"max_tokens must be 0 or more, got {max_tokens}")
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequestError(f"stop must be a list of strings, got {stop!r}")
    return int(max_tokens), tuple(stop)


Chat = Sequence[Mapping[str, Any]]


def chat_as_prompt(
    prompt: str | Sequence[int] | Chat | None, messages: Chat | None
) -> tuple[str | Sequence[int] | None, Chat | None]:
    """(prompt, messages), with a chat given in prompt's place (generate([{"role": ...}]), as
    other clients take it) moved to messages."""
    if isinstance(prompt, list | tuple) and prompt and all(isinstance(m, Mapping) for m in prompt):
        if messages is not None:
            raise InvalidRequestError("a chat was given twice: as the prompt and as messages=", "give it once")
        return None, cast(Chat, prompt)
    return cast("str | Sequence[int] | None", prompt), messages


def check_cancel(cancel: object) -> None:
    """A request's cancel: None or an Event (anything with is_set()). One already set when the
    request starts ends it at once, with no text: a warning says so, since that is most often
    an Event left set by the request before."""
    if cancel is None:
        return
    if not callable(getattr(cancel, "is_set", None)):
        raise InvalidRequestError(
            f"cancel must be a threading.Event, got {type(cancel).__name__}", "pass cancel=threading.Event()"
        )
    if cancel.is_set():  # type: ignore[attr-defined]
        warnings.warn(
            "the cancel Event was already set when the request started, so it ends at once with no text "
            "(finish_reason 'cancelled'); clear() it, or pass a new Event, for each request",
            RuntimeWarning,
            stacklevel=_outside_localspec(),
        )


def _outside_localspec() -> int:
    """The stacklevel of the first caller outside this package: a warning names the app's line."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        level, frame = level + 1, frame.f_back
    return level


def read_stdin() -> str:
    """Standard input as text, whatever its bytes (undecodable ones become U+FFFD)."""
    return sys.stdin.buffer.read().decode("utf-8", "replace")


# A pipe with nothing in it yet after this long is taken for one nobody writes to (a parent
# program's stdin left open), not read: waiting on it would hang.
PIPE_WAIT_SECONDS = 0.5


def piped_stdin() -> str | None:
    """Standard input when text is piped or redirected into it (a pipe or a file, not a
    terminal nor a device such as /dev/null), else None. A pipe that stays empty for
    PIPE_WAIT_SECONDS is left unread, and stderr says so."""
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None  # no real standard input (closed, or replaced as under a test runner)
    if stat.S_ISREG(mode):
        return read_stdin()
    if not stat.S_ISFIFO(mode):
        return None
    try:
        ready, _, _ = select.select([fd], [], [], PIPE_WAIT_SECONDS)
    except (OSError, ValueError):
        ready = [fd]  # Windows selects sockets only: read the pipe, as `llm` does
    if not ready:
        print(
            "localspec: nothing came through the pipe on standard input in time, so the prompt goes alone "
            "(put the whole prompt through the pipe and give '-' to wait for it)",
            file=sys.stderr,
        )
        return None
    return read_stdin()
