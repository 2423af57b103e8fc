"""What a request hands its caller: TextDelta events as text becomes final, then one
Finished, or the whole answer as one Completion (localspec.runtime makes them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from localspec.common.tools import ToolCall
from localspec.core.sampling import TokenLogprob
from localspec.core.stats import Stats, Step


@dataclass(frozen=True)
class TextDelta:
    """New final text, the tokens behind this step and which of them the drafter guessed.
    step: the verify step that emitted them (None for text held back until the end); stats:
    the request's figures so far, updated in place as the stream goes on (read them when the
    event arrives; Finished carries the same value, final)."""

    text: str
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    step: Step | None = None
    stats: Stats | None = None
    # With logprobs=True: tokens[i]'s log-probability and its top_logprobs alternatives.
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    """The end of a stream: the whole text (with tools offered, what is not a call: the
    TextDeltas' texts joined), the request's stats and why it ended ("tool_calls" where the
    model called a tool)."""

    text: str
    stats: Stats
    finish_reason: str
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None  # every token's, with logprobs=True


Event = TextDelta | Finished


@dataclass(frozen=True)
class Completion:
    """generate()'s answer: text (with tools offered, what is not a call), its tokens, stats,
    finish reason, the calls the model made, and each token's logprobs (logprobs=True)."""

    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # logprobs[i] is tokens[i]'s


def is_finished(event: Event) -> bool:
    """Whether an event is a stream's last (localspec.turns ends a turn on it)."""
    return isinstance(event, Finished)
