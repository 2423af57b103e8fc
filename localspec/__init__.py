"""localspec: lossless speculative decoding for local LLMs.

Public API: load() with its LoadOptions, Runtime, load_pool() and its Pool (runtimes that
serve requests side by side in shared passes), the event/result types it returns, the
progress record load() reports, and the errors it raises (every one a LocalspecError)."""

from typing import Any

from localspec.api import Completion, Event, Finished, Prompt, Runtime, Stream, TextDelta, load
from localspec.common.progress import LoadProgress
from localspec.common.tools import ToolCall, ToolRequestError
from localspec.core.errors import (
    BackendClosedError,
    BackendUnavailableError,
    ContextFullError,
    InvalidRequestError,
    LocalspecError,
    ModelLoadError,
    PairMismatchError,
    RuntimeBusyError,
)
from localspec.core.options import LoadOptions
from localspec.core.sampling import SamplingConfig, TokenLogprob
from localspec.core.stats import Stats
from localspec.dispatch import LineFullError
from localspec.pool import Pool, load_pool

__all__ = [
    "BackendClosedError",
    "BackendUnavailableError",
    "Completion",
    "ContextFullError",
    "Event",
    "Finished",
    "InvalidRequestError",
    "LineFullError",
    "LoadOptions",
    "LoadProgress",
    "LocalspecError",
    "ModelLoadError",
    "NotPulledError",
    "PairMismatchError",
    "Pool",
    "Prompt",
    "PullError",
    "Runtime",
    "RuntimeBusyError",
    "SamplingConfig",
    "Stats",
    "Stream",
    "TextDelta",
    "TokenLogprob",
    "ToolCall",
    "ToolRequestError",
    "load",
    "load_pool",
]
__version__ = "0.1.0"

# Errors of the pulling code, imported when first asked for: it brings huggingface-hub.
_LAZY = {"NotPulledError": "localspec.models.pull", "PullError": "localspec.models.hub_errors"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'localspec' has no attribute {name!r}")
