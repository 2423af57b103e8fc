"""One call's arguments, as stream(), generate(), astream() and agenerate() take them, and
what they come to: the sampling, the decoding choices and what stops the request."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from localspec.core.choices import PerRequest, ReusePrefix
from localspec.core.drafting import DraftLengthPolicy
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import KNOBS, PENALTIES, LogprobRecorder, SamplingConfig, check_top_logprobs
from localspec.core.validate import check_cancel
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


class Options(TypedDict, total=False):
    """The keyword options stream(), generate(), astream() and agenerate() take (documented on
    Runtime.stream()): one typed list, so the four calls cannot drift apart and a type checker
    names a misspelt option at the caller."""

    messages: Sequence[Mapping[str, Any]] | None
    max_tokens: int
    stop: Sequence[str]
    cancel: threading.Event | None
    sampling: SamplingConfig | None
    response_format: Mapping[str, Any] | type | None
    json_schema: Mapping[str, Any] | type | None
    timeout: float | None
    tools: Sequence[Any] | None
    tool_choice: Any
    logprobs: bool
    top_logprobs: int | None
    reuse_prefix: ReusePrefix
    speculation: Speculation | Mapping[str, Any] | None
    # SamplingConfig's knobs and penalties, applied to `sampling` (or the default)
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    frequency_penalty: float
    presence_penalty: float
    repeat_penalty: float
    repeat_last_n: int
    logit_bias: Any


# Options' named fields and their defaults: Request's own, then Asked's; the rest are knobs.
FIELDS: dict[str, Any] = {
    "messages": None,
    "max_tokens": 256,
    "stop": (),
    "cancel": None,
    "sampling": None,
    "response_format": None,
    "json_schema": None,
    "timeout": None,
    "reuse_prefix": "any",
    "speculation": None,
}
ASKED: dict[str, Any] = {"tools": None, "tool_choice": None, "logprobs": False, "top_logprobs": None}
NAMED = (*FIELDS, *ASKED)


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

    @classmethod
    def of(cls, prompt: str | Sequence[int] | Prompt | None, options: Mapping[str, Any]) -> Request:
        """A call's prompt and keyword options; what is not one of Options' named fields is a
        sampling knob, checked by sampling_config()."""
        knobs = dict(options)
        check_cancel(knobs.get("cancel"))
        named = {name: knobs.pop(name) for name in NAMED if name in knobs}
        asked = Asked(*(named.get(name, default) for name, default in ASKED.items()))
        fields = {name: named.get(name, default) for name, default in FIELDS.items()}
        return cls(prompt, knobs=knobs, asked=asked, **fields)


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
        takes = ", ".join([*NAMED, *sorted(KNOBS), *PENALTIES])
        raise InvalidRequestError(f"unknown option {unknown[0]!r}", f"generate() and stream() take: {takes}")
    return replace(sampling or SamplingConfig(), **knobs)
