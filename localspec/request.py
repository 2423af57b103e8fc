"""One call's arguments, as stream(), generate(), astream() and agenerate() take them, and
what they come to: the sampling, the decoding choices and what stops the request."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from localspec.core.drafting import DraftLengthPolicy
from localspec.core.engine import PerRequest, ReusePrefix
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import KNOBS, PENALTIES, LogprobRecorder, SamplingConfig, check_top_logprobs
from localspec.events import Event
from localspec.prompts import Prompt
from localspec.strategies import Speculation
from localspec.turns import Turn


@dataclass(frozen=True)
class Asked:
    """What a call asks for beside the text, as serve's requests do: tools it offers (and
    whether one must be called), and each token's logprobs with `top_logprobs` alternatives."""

    tools: Sequence[Any] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def recorder(self, token_bytes: Callable[[int], bytes]) -> LogprobRecorder | None:
        """The request's logprob recorder (None: not asked for); top_logprobs alone asks too."""
        if self.logprobs is not True and self.logprobs is not False:
            raise InvalidRequestError(f"logprobs must be True or False, got {self.logprobs!r}", "top_logprobs=N")
        if not self.logprobs and self.top_logprobs is None:
            return None
        return LogprobRecorder(check_top_logprobs(self.top_logprobs or 0), token_bytes)


@dataclass(frozen=True)
class Request:
    """One call's arguments, as stream(), generate(), astream() and agenerate() take them."""

    prompt: str | Sequence[int] | Prompt | None
    messages: Sequence[Mapping[str, Any]] | None
    max_tokens: int
    stop: Sequence[str]
    cancel: threading.Event | None
    sampling: SamplingConfig | None
    response_format: Mapping[str, Any] | type | None
    json_schema: Mapping[str, Any] | type | None
    timeout: float | None
    knobs: Mapping[str, Any]
    asked: Asked
    reuse_prefix: ReusePrefix = "any"
    speculation: Speculation | Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Stopping:
    """What the engine polls between prompt chunks and steps: the request was halted
    (close(), a new call in its thread) or its cancel Event was set."""

    turn: Turn[Event]
    cancel: threading.Event | None

    def __call__(self) -> bool:
        return self.turn.stopping() or (self.cancel is not None and self.cancel.is_set())

    def reason(self, default: str) -> str:
        return self.turn.halted or default


@dataclass(frozen=True)
class Decoding:
    """How one request decodes: its choices, the policy and strategy label they come to, and
    what stops it."""

    choices: PerRequest
    policy: DraftLengthPolicy
    label: str
    stopping: Stopping


def sampling_config(sampling: SamplingConfig | None, knobs: Mapping[str, Any]) -> SamplingConfig:
    """stream()/generate()'s sampling, with any knobs given as keywords applied to it."""
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise InvalidRequestError(f"sampling must be a SamplingConfig, got {sampling!r}")
    unknown = sorted(set(knobs) - set(KNOBS) - set(PENALTIES))
    if "stream" in unknown:  # openai's and ollama's flag: here streaming is its own method
        raise InvalidRequestError("generate() has no stream option", "call runtime.stream(...) for events as they come")
    if unknown:
        named = ["max_tokens", "stop", "cancel", "sampling", "response_format", "json_schema", "timeout", "tools"]
        takes = ", ".join(
            [
                *named,
                "tool_choice",
                "logprobs",
                "top_logprobs",
                "reuse_prefix",
                "speculation",
                *sorted(KNOBS),
                *PENALTIES,
            ]
        )
        raise InvalidRequestError(f"unknown option {unknown[0]!r}", f"generate() and stream() take: {takes}")
    return replace(sampling or SamplingConfig(), **knobs)
