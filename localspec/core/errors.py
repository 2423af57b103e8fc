"""Errors a user can act on: every one carries the fix in its message. Fixes are written in
the command line's flags; raised to a Python caller (localspec.load()), they name load()'s
arguments instead (in_api_terms)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager


class LocalspecError(Exception):
    """Base of every error localspec raises on purpose; the CLI prints it without a traceback."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message if hint is None else f"{message}\n  -> {hint}")
        self.message = message
        self.hint = hint


class ModelLoadError(LocalspecError):
    """A model file is missing, unreadable, truncated or not a model."""


class PairMismatchError(LocalspecError):
    """A drafter and a target that do not share a tokenizer."""


class BackendUnavailableError(LocalspecError):
    """A backend whose library is not installed or cannot run on this machine."""


class InvalidRequestError(LocalspecError):
    """A generation request that cannot be served as given (empty prompt, bad option...)."""


class NotSharedError(InvalidRequestError):
    """What a model loaded for shared passes (lanes) cannot serve there yet: a pool then serves
    it one request at a time, with this message as its note."""


class ContextFullError(LocalspecError):
    """The prompt alone does not fit in the model's context window."""


class BackendClosedError(InvalidRequestError):
    """A model or runtime used after close(): its memory is gone, so the call is refused."""


class RuntimeBusyError(LocalspecError):
    """A request that waited its timeout= for a runtime another request still held."""


# Each CLI flag a fix may name, and the load() argument that does the same. A fix that names
# both already ("--draft-model PATH (or draft_model=)") keeps the argument alone.
_API_TERMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(flag), argument)
    for flag, argument in (
        (r" \(or [a-z_]+=\)", ""),
        (r"--draft-model PATH", "draft_model=PATH"),
        (r"--draft-model\b", "draft_model="),
        (r"(--model|-m) PATH", "model=PATH"),
        (r"--model\b", "model="),
        (r"--strategy ([\w:.-]+)", r'strategy="\1"'),
        (r"--backend ([\w.-]+)", r'backend="\1"'),
        (r"--ctx (\d+)", r"n_ctx=\1"),
        (r"--ctx\b", "n_ctx="),
        (r"--threads (\d+)", r"threads=\1"),
        (r"--gpu-layers (\d+)", r"gpu_layers=\1"),
        (r"--gpu-layers\b", "gpu_layers="),
        (r"--draft-tokens\b", "draft_tokens="),
        (r"--no-memory\b", "memory=False"),
        (r"--exact\b", "exact=True"),
        (r"--(strategy|backend|threads|rpc)\b", r"\1="),
    )
)
_cli_running = 0  # > 0 while localspec's own command line runs in this process


@contextmanager
def cli_terms() -> Iterator[None]:
    """Within the block (the CLI's main()), fixes keep naming the command line's flags."""
    global _cli_running
    _cli_running += 1
    try:
        yield
    finally:
        _cli_running -= 1


def api_terms(text: str) -> str:
    """text with the CLI flags it names as load()'s arguments (--ctx 4096 -> n_ctx=4096)."""
    for flag, argument in _API_TERMS:
        text = flag.sub(argument, text)
    return text


def in_api_terms(exc: LocalspecError) -> LocalspecError:
    """exc, its message and fix naming load()'s arguments, unless the CLI is the caller."""
    if not _cli_running:
        exc.message, exc.hint = api_terms(exc.message), None if exc.hint is None else api_terms(exc.hint)
        exc.args = (exc.message if exc.hint is None else f"{exc.message}\n  -> {exc.hint}",)
    return exc
