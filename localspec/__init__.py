"""localspec: lossless speculative decoding for local LLMs.

Public API: load() with its LoadOptions, Runtime, and the event/result types it returns."""

from localspec.api import Completion, Event, Finished, Prompt, Runtime, Stream, TextDelta, load
from localspec.core.errors import LocalspecError
from localspec.core.options import LoadOptions
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats

__all__ = [
    "Completion",
    "Event",
    "Finished",
    "LoadOptions",
    "LocalspecError",
    "Prompt",
    "Runtime",
    "SamplingConfig",
    "Stats",
    "Stream",
    "TextDelta",
    "load",
]
__version__ = "0.1.0"
