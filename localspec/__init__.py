"""localspec: lossless speculative decoding for local LLMs.

Public API: load(), Runtime, and the event/result types it returns."""

from localspec.api import Completion, Event, Finished, Runtime, TextDelta, load
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig
from localspec.stats import Stats

__all__ = [
    "Completion",
    "Event",
    "Finished",
    "LocalspecError",
    "Runtime",
    "SamplingConfig",
    "Stats",
    "TextDelta",
    "load",
]
__version__ = "0.1.0"
