"""The Runtime: a loaded target with its drafter, answering one request at a time as a
stream of events. localspec.api loads one; this module is what it hands back. A request's
parts live beside it: request (its arguments), prompts, constraints, output and events.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack

import numpy as np

from localspec.assembly import Assembly, assemble
from localspec.common.textstream import TextAssembler
from localspec.common.tools import ToolRequest, tool_request
from localspec.constraints import Constraints
from localspec.control.calibrate import LearntCurve, note_drift
from localspec.control.contention import threads_notice
from localspec.core.choices import REUSE_PREFIX, PerRequest
from localspec.core.drafting import DraftLengthPolicy
from localspec.core.engine import Engine
from localspec.core.errors import InvalidRequestError
from localspec.core.exactness import judge as judge_exactness
from localspec.core.grammar import GRAMMAR_DEAD_END, GrammarConstraint, Grammars
from localspec.core.protocol import SharesPasses
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats
from localspec.core.validate import check_limits
from localspec.drafters import Drafter
from localspec.events import Completion, Event, Finished, TextDelta, is_finished
from localspec.output import Answer, Output, dead_end
from localspec.prompts import Prompt, prepare, prompt_tokens, request_tokens, tool_prompt
from localspec.request import Decoding, Options, Request, Stopping, sampling_config
from localspec.strategies import Plan, Speculation, drafting
from localspec.turns import CANCELLED, AsyncStream, Turn, Turns, TurnStream

# What callers import from here (localspec.api re-exports the public ones).
__all__ = [
    "Completion",
    "Event",
    "Finished",
    "Options",
    "Prompt",
    "Request",
    "Runtime",
    "Stream",
    "TextDelta",
    "sampling_config",
]


class Stream(TurnStream[Event]):
    """One request's events: TextDelta as text becomes final, then one Finished, however it
    ends. It holds the runtime from stream() until it ends: read to its Finished event,
    close()d from any thread, left by a `with` block, or dropped by its caller (CPython frees
    it at once, and that closes it). localspec.turns says who waits for whom."""


class Runtime:
    """A loaded target with its drafter. One request at a time (localspec.turns): calls wait
    their turn in the order they came, for at most their timeout=; a new call in the thread
    of an unfinished stream ends that stream (its Finished says "preempted"), and a Stream its
    caller drops is closed when it is freed. astream()/agenerate() are the same for asyncio."""

    def __init__(self, plan: Plan, assembly: Assembly | None = None) -> None:
        """plan: a strategy resolved for its target (localspec.strategies.resolve or plan);
        assembly: its parts, put together once (localspec.assembly.assemble; None: assembled
        here, calibrating as it needs)."""
        parts = assembly if assembly is not None else assemble(plan)
        self.plan = plan
        self.target = plan.target
        self.draft = plan.draft
        self.label = plan.label
        # Earlier requests' text, which n-gram lookup searches beside the request's own.
        self.memory = plan.memory
        self.drafter: Drafter = plan.drafter
        self.engine: Engine = parts.engine
        self._policy = parts.policy
        self._turns: Turns[Event] = Turns(last=is_finished)  # who holds the runtime, who waits
        # The cost curve the plan's policy learns (a policy the caller chose is not remembered).
        self._costs = parts.priced.costs if parts.priced is not None else None
        self._drift_noted = False
        # Where the next load starts: what the curve learnt, stored now and then (not per request).
        self._learnt = LearntCurve(self.target, self._costs) if self._costs is not None else None
        self._constraints = Constraints(self.target)  # its grammar engine is built on first use

    @property
    def strategy(self) -> str:
        """The strategy its plan was built by, "auto" resolved."""
        return self.plan.strategy

    @property
    def policy(self) -> DraftLengthPolicy:
        """The draft-length policy its requests share (one asking for its own speculation
        decodes under a policy of its own, see stream())."""
        return self._policy

    # -- requests ---------------------------------------------------------------------------

    def prompt_tokens(
        self, prompt: str | Sequence[int] | None = None, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """prompt is text, or token ids as given (a fill-in-the-middle prompt's control tokens),
        or a chat given in messages' place."""
        return prompt_tokens(self.target, prompt, messages)

    def prepare(
        self, prompt: str | Sequence[int] | None = None, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> Prompt:
        """Check and tokenize a prompt once, e.g. in a server's request thread while another
        request runs, so a prompt that does not fit is refused before it waits its turn."""
        return prepare(self.target, prompt, messages)

    def stream(self, prompt: str | Sequence[int] | Prompt | None = None, **options: Unpack[Options]) -> Stream:
        """A Stream of TextDelta events as text becomes final, then one Finished event. It
        takes the runtime now (waiting in line while another request holds it, at most
        `timeout` seconds, then RuntimeBusyError) and keeps it until it ends: close() it, from
        any thread, or use `with`, to stop early. Setting `cancel` ends the request at the next
        prompt chunk or verify step (finish reason "cancelled"), so another thread can stop
        even a long prompt evaluation. sampling defaults to SamplingConfig(); knobs
        (temperature=0, seed=1...) change its fields. response_format (OpenAI's shapes:
        {"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": ...}}) or
        json_schema (a JSON schema itself, or a pydantic model class) constrain the answer to that
        JSON (see constraint()). tools (OpenAI's tools or pydantic model classes) and
        tool_choice offer functions as serve does: Finished.tool_calls has the calls, and
        the text shows none. logprobs=True (top_logprobs=N alternatives) puts each token's
        log-probability in TextDelta.logprobs; penalties are knobs too (frequency_penalty=...).
        reuse_prefix: how much of what earlier requests cached this one reuses: "any" matching
        prefix (fastest), "exact" only what a fresh evaluation computes in the same blocks (the
        answer then does not depend on earlier requests), "none" nothing. speculation: this
        request's drafting (a localspec.strategies.Speculation, or a dict of its fields):
        {"strategy": "none"} decodes plainly, {"draft_tokens": 4} fixes the draft length,
        {"max_draft": 8} caps it, {"min_confidence": 0.5} ends a draft model's or a head's drafts
        after a token it gives under 50 %; the answer is the same, only the speed changes."""
        request = Request.of(prompt, options)
        turn: Turn[Event] = Turn()
        self._start(request, turn)
        return Stream(self._turns, turn)

    def generate(self, prompt: str | Sequence[int] | Prompt | None = None, **options: Unpack[Options]) -> Completion:
        """stream()'s answer in one piece."""
        request = Request.of(prompt, options)
        turn: Turn[Event] = Turn()
        self._start(request, turn)
        answer = Answer()
        with Stream(self._turns, turn) as events:
            for event in events:
                if (done := answer.add(event)) is not None:
                    return done
        raise AssertionError("a stream always ends with a Finished event")

    def astream(
        self, prompt: str | Sequence[int] | Prompt | None = None, **options: Unpack[Options]
    ) -> AsyncStream[Event]:
        """stream() for asyncio: `async for event in runtime.astream(...)`. The request is
        checked, waits its turn and runs in a thread of its own, so the event loop is never
        blocked, even while another request holds the runtime; errors are raised where the
        events are read. Cancelling the task that reads it (or `aclose()`, or leaving
        `async with runtime.astream(...) as events:`) stops the request without waiting."""
        request = Request.of(prompt, options)
        return AsyncStream(self._turns, lambda turn: self._start(request, turn))

    async def agenerate(
        self, prompt: str | Sequence[int] | Prompt | None = None, **options: Unpack[Options]
    ) -> Completion:
        """generate() for asyncio: `await runtime.agenerate(...)`; cancelling the awaiting task
        stops the request (see astream())."""
        request = Request.of(prompt, options)
        answer = Answer()
        async with AsyncStream(self._turns, lambda turn: self._start(request, turn)) as events:
            async for event in events:
                if (done := answer.add(event)) is not None:
                    return done
        raise AssertionError("a stream always ends with a Finished event")

    def _start(self, request: Request, turn: Turn[Event]) -> None:
        """Check and tokenize a request, give the turn its events and take the runtime for it."""
        self._turns.check_open()
        tools = tool_request(request.asked.tools, request.asked.tool_choice)
        cfg = self._request_sampling(request, tools)
        max_tokens, stop = check_limits(request.max_tokens, request.stop)
        if request.timeout is not None and not (isinstance(request.timeout, (int, float)) and request.timeout >= 0):
            raise InvalidRequestError(f"timeout must be seconds >= 0 or None, got {request.timeout!r}")
        tokens = request_tokens(self.target, request.prompt, request.messages, tools)
        output = Output(TextAssembler(self.target.token_bytes, stop), tools, cfg.logprobs)
        turn.events = self._run(
            tokens, max_tokens, cfg, output, self._decoding(request, Stopping(turn, request.cancel))
        )
        self._turns.take(turn, request.timeout)

    def _decoding(self, request: Request, stopping: Stopping) -> Decoding:
        """What the request chose of the cache and of speculation, checked."""
        if request.reuse_prefix not in REUSE_PREFIX:
            raise InvalidRequestError(
                f"reuse_prefix must be one of {', '.join(map(repr, REUSE_PREFIX))}, got {request.reuse_prefix!r}",
                '"exact" gives the answer a fresh evaluation would (serve\'s default), "any" is fastest',
            )
        how = drafting(self.plan, Speculation.of(request.speculation))
        choices = PerRequest(request.reuse_prefix, how.guess, how.max_draft, how.min_confidence)
        return Decoding(choices, how.policy or self.policy, how.label or self.label, stopping)

    def _request_sampling(self, request: Request, tools: ToolRequest | None) -> SamplingConfig:
        """The request's sampling with its own parts: its grammar (a JSON schema, or a forced
        tool call) and its logprob recorder."""
        cfg = sampling_config(request.sampling, request.knobs)
        constraint = self.constraint(request.response_format, request.json_schema)
        if tools is not None and tools.forced:
            if constraint is not None:
                raise InvalidRequestError(
                    "a forced tool call and response_format/json_schema both say what the answer is",
                    "give one: tool_choice='auto' lets the model answer in the schema or call a tool",
                )
            constraint = self.tool_constraint(tools)
        if constraint is not None:
            if cfg.constraint is not None:
                raise InvalidRequestError("give response_format/json_schema/tools or sampling.constraint, not both")
            cfg = replace(cfg, constraint=constraint)
        recorder = request.asked.recorder(self.target.token_bytes)
        return cfg if recorder is None else replace(cfg, logprobs=recorder)

    def tool_prompt(self, tools: ToolRequest, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """A chat offered tools, as token ids: through the model's own template where it renders
        tools, else with Hermes' system block (the grammar of a forced call follows the same).
        serve's chats with tools go through here too."""
        return tool_prompt(self.target, tools, messages)

    def tool_constraint(self, tools: ToolRequest) -> GrammarConstraint:
        """A forced call's grammar, in the call format the model's template implies (one of the
        offered functions, its arguments valid for its schema)."""
        return self._constraints.tool_call(tools)

    @property
    def grammars(self) -> Grammars:
        """The target's grammar engine (llguidance's tokenizer, one pass over the vocabulary,
        built on first use), which compiles the constraints requests ask for."""
        return self._constraints.grammars

    def constraint(
        self,
        response_format: Mapping[str, Any] | type | None = None,
        json_schema: Mapping[str, Any] | type | None = None,
    ) -> GrammarConstraint | None:
        """A fresh constraint for one request (it keeps that request's grammar state): the JSON
        an OpenAI response_format, a JSON schema or a pydantic model class asks for; None for
        free text. Strict: objects are closed to keys their schema does not list, unless it
        says additionalProperties (pydantic: extra="allow"), or response_format's json_schema
        says "strict": false. A schema that cannot be compiled raises InvalidRequestError."""
        return self._constraints.answer(response_format, json_schema)

    def _run(
        self,
        tokens: list[int],
        max_tokens: int,
        cfg: SamplingConfig,
        output: Output,
        how: Decoding,
    ) -> Generator[Event, None, None]:
        stats, stopping = Stats(strategy=how.label), how.stopping
        if stopping():  # stopped before it began
            stats.prompt_tokens = len(tokens)
            yield Finished("", stats, stopping.reason(CANCELLED))
            return
        said = list(tokens)  # the prompt, then the answer: what the memory keeps
        try:
            rng = np.random.default_rng(cfg.seed)
            steps = self.engine.generate(tokens, max_tokens, cfg, how.policy, stats, rng, stopping, how.choices)
            for step in steps:
                said.extend(step.tokens)
                yield output.step(step, stats)
                if output.text.stopped:
                    stats.finish_reason = "stop"
                    break
            if (busy := threads_notice(self.target.capabilities)) is not None and busy not in stats.notices:
                stats.notices.append(busy)  # a busy machine, not the drafter, may be why this was slow
            judge_exactness(stats, self.target.capabilities.exactness, cfg.greedy)
            tail = output.tail()
            if tail:
                yield TextDelta(tail, (), (), None, stats)
            if stats.finish_reason == "stop" and dead_end(cfg, stats.generated_tokens):
                stats.finish_reason = GRAMMAR_DEAD_END  # the grammar allowed nothing more: not a stop
            if stats.finish_reason == CANCELLED:
                stats.finish_reason = stopping.reason(CANCELLED)  # "preempted" says who stopped it
            yield output.finished(stats)
        finally:
            if self.memory is not None:
                self.memory.add(said)
            if isinstance(self.target, SharesPasses):  # the other requests' passes stop waiting for it
                self.target.idle()
            self._note_drift()

    def _note_drift(self) -> None:
        # Once per load: a cache the machine has drifted from is not trusted next time.
        if self._costs is not None and not self._drift_noted:
            self._drift_noted = note_drift(self._costs, [b for b in (self.target, self.draft) if b is not None])
        if self._learnt is not None:
            self._learnt.after_request()

    def remember(
        self, prompt: str | Sequence[int] | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Add a text or a conversation (a past chat, a document the app expects answers to
        quote) to the memory n-gram lookup searches. Takes the runtime like a request, so a
        thread can feed many between another's requests."""
        if self.memory is None:
            return
        turn: Turn[Event] = Turn()
        self._turns.take(turn)  # refuses a closed runtime
        try:
            self.memory.add(self.prompt_tokens(prompt, messages))
        finally:
            self._turns.release(turn)

    # -- one request at a time (localspec.turns) ----------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a request holds the runtime or waits for it: a call now would wait its turn
        (a UI can grey out its button, or pass timeout=)."""
        return self._turns.busy

    @property
    def waiting(self) -> int:
        """How many requests wait in line behind the one running."""
        return self._turns.waiting

    def idle_drafter_note(self, stats: Stats) -> str | None:
        """Why a draft model drafted nothing in a request, in the costs the controller weighed
        (None where it drafted, or no model drafts)."""
        prices = self.policy.prices()
        by_model = stats.drafted - stats.lookup_drafted
        if by_model or self.draft is None or prices is None:
            return None
        return (
            f"the {self.label} drafter drafted nothing, so this answer was decoded plainly (as fast as without "
            f"a drafter): here checking 2 tokens in one pass costs {prices.pair:.2f} single-token steps and guessing "
            f"a token costs {prices.draft:.2f} of a step, so at how often its guesses were right no draft length "
            "pays; a busy machine makes passes look dearer (`localspec doctor` shows the cost curve)"
        )

    def close(self) -> None:
        """Stop and free the models, from any thread. A request running is stopped within its
        step in flight (its reader gets Finished("cancelled")), requests waiting raise
        BackendClosedError, and so does any later call; no model is freed under a thread using it."""
        if not self._turns.close():
            return
        if self._learnt is not None:
            self._learnt.close()
        self.drafter.close()
        self.target.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
