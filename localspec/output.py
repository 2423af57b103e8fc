"""A request's output, shaped for its reader: the engine's steps as events (final text,
logprobs, tool calls), and a stream's events gathered into one Completion."""

from __future__ import annotations

from localspec.common.textstream import TextAssembler
from localspec.common.tool_parsing import CallFilter
from localspec.common.tools import ToolCall, ToolRequest
from localspec.core.grammar import GrammarConstraint
from localspec.core.sampling import LogprobRecorder, SamplingConfig, TokenLogprob
from localspec.core.stats import Stats, Step
from localspec.events import Completion, Event, Finished, TextDelta


class Output:
    """A request's steps as the events its reader gets: final text (held back where a stop
    string may begin and, with tools offered, where a call may: common/tools.CallFilter, as
    serve streams it), each step's tokens' logprobs, and at the end the calls made."""

    def __init__(self, text: TextAssembler, tools: ToolRequest | None, recorder: LogprobRecorder | None) -> None:
        self.text = text
        self.calls = None if tools is None else CallFilter(tools.names)
        self.recorder = recorder
        self.read = 0  # the recorder's entries handed out with deltas so far
        self.shown: list[str] = []
        self.tool_calls: tuple[ToolCall, ...] = ()

    def step(self, step: Step, stats: Stats) -> TextDelta:
        n = step.n_from_draft
        flags = (True,) * n + (False,) * (len(step.tokens) - n)
        logprobs: tuple[TokenLogprob, ...] = ()
        if self.recorder is not None:  # read by position: a server's feed takes from the same recorder
            logprobs = tuple(self.recorder.entries[self.read : self.read + len(step.tokens)])
            self.read += len(logprobs)
        return TextDelta(self._show(self.text.push(step.tokens)), step.tokens, flags, step, stats, logprobs)

    def tail(self) -> str:
        """What was held back, now that the answer is done; the calls in it are kept."""
        tail = self._show(self.text.flush())
        if self.calls is not None:
            content, calls = self.calls.finish()
            self.tool_calls = tuple(ToolCall.of(call) for call in calls)
            tail += self._show(content or "", filtered=False)
        return tail

    def finished(self, stats: Stats) -> Finished:
        reason = "tool_calls" if self.tool_calls else stats.finish_reason
        logprobs = None if self.recorder is None else tuple(self.recorder.entries)
        return Finished("".join(self.shown), stats, reason, self.tool_calls, logprobs)

    def _show(self, text: str, filtered: bool = True) -> str:
        if filtered and self.calls is not None:
            text = self.calls.push(text)
        self.shown.append(text)
        return text


class Answer:
    """A stream's events gathered into a Completion."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def add(self, event: Event) -> Completion | None:
        if isinstance(event, TextDelta):
            self.tokens.extend(event.tokens)
            return None
        logprobs = None if event.logprobs is None else list(event.logprobs)
        return Completion(event.text, self.tokens, event.stats, event.finish_reason, list(event.tool_calls), logprobs)


def dead_end(cfg: SamplingConfig, generated: int) -> bool:
    """Whether an answer of `generated` tokens ended because its grammar allowed nothing more."""
    return isinstance(cfg.constraint, GrammarConstraint) and cfg.constraint.ended_at_dead_end(generated)
