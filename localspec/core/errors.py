"""Errors a user can act on: every one carries the fix in its message."""

from __future__ import annotations


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


class ContextFullError(LocalspecError):
    """The prompt alone does not fit in the model's context window."""


class BackendClosedError(InvalidRequestError):
    """A model or runtime used after close(): its memory is gone, so the call is refused."""
