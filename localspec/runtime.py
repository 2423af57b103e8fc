"""The Runtime: a loaded target with its drafter, answering one request at a time as a
stream of events. localspec.api loads one; this module is what it hands back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from localspec.assembly import Assembly, assemble
from localspec.control.calibrate import note_drift, remember_learnt
from localspec.control.contention import threads_notice
from localspec.core.engine import REUSE_PREFIX, Engine, PerRequest, ReusePrefix, check_fits
from localspec.core.errors import InvalidRequestError
from localspec.core.exactness import judge as judge_exactness
from localspec.core.grammar import GRAMMAR_DEAD_END, GrammarConstraint, Grammars, is_schema_model, json_schema_of
from localspec.core.media import has_images, image_chat_tokens
from localspec.core.protocol import DraftLengthPolicy, SharesPasses
from localspec.core.sampling import (
    KNOBS,
    PENALTIES,
    LogprobRecorder,
    SamplingConfig,
    TokenLogprob,
    check_top_logprobs,
)
from localspec.core.stats import Stats, Step
from localspec.core.templates import chat_tokens, normalize_messages, render_chat
from localspec.core.textstream import TextAssembler
from localspec.core.tools import CallFilter, ToolCall, ToolRequest, tool_request, tool_style, with_calls
from localspec.core.validate import chat_as_prompt, check_cancel, check_limits, clean_text
from localspec.drafters import Drafter
from localspec.strategies import Plan, Speculation, drafting
from localspec.turns import CANCELLED, AsyncStream, Turn, Turns, TurnStream


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


@dataclass(frozen=True)
class Prompt:
    """A prompt a runtime has checked and tokenized (Runtime.prepare). stream() and generate()
    take it as prompt= and use its ids as they are: a server tokenizes each request once."""

    ids: tuple[int, ...]


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
        self._turns: Turns[Event] = Turns(last=_is_finished)  # who holds the runtime, who waits
        # The cost curve the plan's policy learns (a policy the caller chose is not remembered).
        self._costs = parts.priced.costs if parts.priced is not None else None
        self._drift_noted = False
        self._grammars: Grammars | None = None  # the target's grammar tokenizer, built on first use

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
        prompt, messages = chat_as_prompt(prompt, messages)
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("give either prompt= (plain text) or messages= (a chat), not both or neither")
        if messages is not None and has_images(messages):
            return image_chat_tokens(self.target, messages)
        if messages is not None:
            chat = normalize_messages(messages)
            template = self.target.chat_template()
            text = render_chat(template, chat, self.target.special_texts(), source=self.target.info.path)
            return chat_tokens(self.target, text, [m["content"] for m in chat])
        if isinstance(prompt, (list, tuple)):
            n_vocab = self.target.info.n_vocab
            ids_ok = all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in prompt)
            if not prompt or not ids_ok:
                raise InvalidRequestError(f"prompt token ids must be whole numbers 0 to {n_vocab - 1}, at least one")
            return list(prompt)
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        prompt = clean_text(prompt)
        if not prompt:
            raise InvalidRequestError("the prompt is empty", "give some text to continue")
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

    def prepare(
        self, prompt: str | Sequence[int] | None = None, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> Prompt:
        """Check and tokenize a prompt once, e.g. in a server's request thread while another
        request runs, so a prompt that does not fit is refused before it waits its turn."""
        tokens = self.prompt_tokens(prompt, messages)
        check_fits(tokens, self.target.info.n_ctx)
        return Prompt(tuple(tokens))

    def stream(
        self,
        prompt: str | Sequence[int] | Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        response_format: Mapping[str, Any] | type | None = None,
        json_schema: Mapping[str, Any] | type | None = None,
        timeout: float | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        reuse_prefix: ReusePrefix = "any",
        speculation: Speculation | Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> Stream:
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
        check_cancel(cancel)
        request = Request(
            prompt,
            messages,
            max_tokens,
            stop,
            cancel,
            sampling,
            response_format,
            json_schema,
            timeout,
            knobs,
            Asked(tools, tool_choice, logprobs, top_logprobs),
            reuse_prefix,
            speculation,
        )
        turn: Turn[Event] = Turn()
        self._start(request, turn)
        return Stream(self._turns, turn)

    def generate(
        self,
        prompt: str | Sequence[int] | Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        response_format: Mapping[str, Any] | type | None = None,
        json_schema: Mapping[str, Any] | type | None = None,
        timeout: float | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        reuse_prefix: ReusePrefix = "any",
        speculation: Speculation | Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> Completion:
        """stream()'s answer in one piece."""
        check_cancel(cancel)
        request = Request(
            prompt,
            messages,
            max_tokens,
            stop,
            cancel,
            sampling,
            response_format,
            json_schema,
            timeout,
            knobs,
            Asked(tools, tool_choice, logprobs, top_logprobs),
            reuse_prefix,
            speculation,
        )
        turn: Turn[Event] = Turn()
        self._start(request, turn)
        answer = _Answer()
        with Stream(self._turns, turn) as events:
            for event in events:
                if (done := answer.add(event)) is not None:
                    return done
        raise AssertionError("a stream always ends with a Finished event")

    def astream(
        self,
        prompt: str | Sequence[int] | Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        response_format: Mapping[str, Any] | type | None = None,
        json_schema: Mapping[str, Any] | type | None = None,
        timeout: float | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        reuse_prefix: ReusePrefix = "any",
        speculation: Speculation | Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> AsyncStream[Event]:
        """stream() for asyncio: `async for event in runtime.astream(...)`. The request is
        checked, waits its turn and runs in a thread of its own, so the event loop is never
        blocked, even while another request holds the runtime; errors are raised where the
        events are read. Cancelling the task that reads it (or `aclose()`, or leaving
        `async with runtime.astream(...) as events:`) stops the request without waiting."""
        check_cancel(cancel)
        request = Request(
            prompt,
            messages,
            max_tokens,
            stop,
            cancel,
            sampling,
            response_format,
            json_schema,
            timeout,
            knobs,
            Asked(tools, tool_choice, logprobs, top_logprobs),
            reuse_prefix,
            speculation,
        )
        return AsyncStream(self._turns, lambda turn: self._start(request, turn))

    async def agenerate(
        self,
        prompt: str | Sequence[int] | Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        response_format: Mapping[str, Any] | type | None = None,
        json_schema: Mapping[str, Any] | type | None = None,
        timeout: float | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        reuse_prefix: ReusePrefix = "any",
        speculation: Speculation | Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> Completion:
        """generate() for asyncio: `await runtime.agenerate(...)`; cancelling the awaiting task
        stops the request (see astream())."""
        check_cancel(cancel)
        request = Request(
            prompt,
            messages,
            max_tokens,
            stop,
            cancel,
            sampling,
            response_format,
            json_schema,
            timeout,
            knobs,
            Asked(tools, tool_choice, logprobs, top_logprobs),
            reuse_prefix,
            speculation,
        )
        answer = _Answer()
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
        tokens = self._request_tokens(request, tools)
        output = _Output(TextAssembler(self.target.token_bytes, stop), tools, cfg.logprobs)
        turn.events = self._run(
            tokens, max_tokens, cfg, output, self._decoding(request, _Stopping(turn, request.cancel))
        )
        self._turns.take(turn, request.timeout)

    def _decoding(self, request: Request, stopping: _Stopping) -> _Decoding:
        """What the request chose of the cache and of speculation, checked."""
        if request.reuse_prefix not in REUSE_PREFIX:
            raise InvalidRequestError(
                f"reuse_prefix must be one of {', '.join(map(repr, REUSE_PREFIX))}, got {request.reuse_prefix!r}",
                '"exact" gives the answer a fresh evaluation would (serve\'s default), "any" is fastest',
            )
        how = drafting(self.plan, Speculation.of(request.speculation))
        choices = PerRequest(request.reuse_prefix, how.guess, how.max_draft, how.min_confidence)
        return _Decoding(choices, how.policy or self.policy, how.label or self.label, stopping)

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

    def _request_tokens(self, request: Request, tools: ToolRequest | None) -> list[int]:
        prompt = request.prompt
        if tools is not None:  # the functions are described in the chat: a chat it must be
            given, messages = (prompt, None) if isinstance(prompt, Prompt) else chat_as_prompt(prompt, request.messages)
            if messages is None or given is not None:
                raise InvalidRequestError("tools= needs a chat", "give messages=[...] instead of prompt=")
            tokens = self.tool_prompt(tools, messages)
        elif isinstance(prompt, Prompt):  # checked and tokenized by prepare(): not again
            if request.messages is not None:
                raise InvalidRequestError("give either prompt= or messages=, not both")
            tokens = list(prompt.ids)
        else:
            return list(self.prepare(prompt, request.messages).ids)
        check_fits(tokens, self.target.info.n_ctx)
        return tokens

    def tool_prompt(self, tools: ToolRequest, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """A chat offered tools, as token ids: through the model's own template where it renders
        tools, else with Hermes' system block (the grammar of a forced call follows the same).
        serve's chats with tools go through here too."""
        target = self.target
        template = target.chat_template()
        given = normalize_messages(with_calls(messages))
        if not tool_style(template).native:
            return self.prompt_tokens(messages=tools.messages(given))
        chat = normalize_messages(tools.native_messages(given))
        text = render_chat(template, chat, target.special_texts(), tools=tools.tools(), source=target.info.path)
        return chat_tokens(target, text, [m["content"] for m in chat])

    def tool_constraint(self, tools: ToolRequest) -> GrammarConstraint:
        """A forced call's grammar, in the call format the model's template implies (one of the
        offered functions, its arguments valid for its schema)."""
        grammars = self.grammars
        style = tool_style(self.target.chat_template())
        return grammars.lark(tools.grammar(style.format, grammars.spell), "tools")

    @property
    def grammars(self) -> Grammars:
        """The target's grammar engine (llguidance's tokenizer, one pass over the vocabulary,
        built on first use), which compiles the constraints requests ask for."""
        if self._grammars is None:
            self._grammars = Grammars(self.target)
        return self._grammars

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
        if response_format is not None and json_schema is not None:
            raise InvalidRequestError("give response_format= or json_schema=, not both")
        if json_schema is not None:
            if not isinstance(json_schema, Mapping) and not is_schema_model(json_schema):
                raise InvalidRequestError(
                    f"json_schema must be a dict (a JSON schema) or a pydantic model class, "
                    f"got {type(json_schema).__name__}",
                    'e.g. json_schema={"type": "object", "properties": {"name": {"type": "string"}}}',
                )
            schema = json_schema_of({"type": "json_schema", "json_schema": {"schema": json_schema}})
            return None if schema is None else self.grammars.json_schema(schema, "json_schema")
        if response_format is None:
            return None
        schema = json_schema_of(response_format)
        return None if schema is None else self.grammars.json_schema(schema)

    def _run(
        self,
        tokens: list[int],
        max_tokens: int,
        cfg: SamplingConfig,
        output: _Output,
        how: _Decoding,
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
            if stats.finish_reason == "stop" and _dead_end(cfg, stats.generated_tokens):
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
        if self._costs is not None:
            remember_learnt(self.target, self._costs)  # a learning curve: the next load starts there

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
        self.drafter.close()
        self.target.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
class _Decoding:
    """How one request decodes: its choices, the policy and strategy label they come to, and
    what stops it."""

    choices: PerRequest
    policy: DraftLengthPolicy
    label: str
    stopping: _Stopping


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
class _Stopping:
    """What the engine polls between prompt chunks and steps: the request was halted
    (close(), a new call in its thread) or its cancel Event was set."""

    turn: Turn[Event]
    cancel: threading.Event | None

    def __call__(self) -> bool:
        return self.turn.stopping() or (self.cancel is not None and self.cancel.is_set())

    def reason(self, default: str) -> str:
        return self.turn.halted or default


class _Output:
    """A request's steps as the events its reader gets: final text (held back where a stop
    string may begin and, with tools offered, where a call may: core/tools.CallFilter, as
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


class _Answer:
    """A stream's events gathered into a Completion."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def add(self, event: Event) -> Completion | None:
        if isinstance(event, TextDelta):
            self.tokens.extend(event.tokens)
            return None
        logprobs = None if event.logprobs is None else list(event.logprobs)
        return Completion(event.text, self.tokens, event.stats, event.finish_reason, list(event.tool_calls), logprobs)


def _is_finished(event: Event) -> bool:
    return isinstance(event, Finished)


def _dead_end(cfg: SamplingConfig, generated: int) -> bool:
    """Whether an answer of `generated` tokens ended because its grammar allowed nothing more."""
    return isinstance(cfg.constraint, GrammarConstraint) and cfg.constraint.ended_at_dead_end(generated)


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
