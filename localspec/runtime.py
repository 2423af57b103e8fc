"""The Runtime: a loaded target with its drafter, answering one request at a time as a
stream of events. localspec.api loads one; this module is what it hands back.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from localspec.control.calibrate import note_drift, remember_learnt
from localspec.control.contention import threads_notice
from localspec.control.costs import CostCurve
from localspec.control.trees import attach_trees
from localspec.core.engine import Engine, check_fits
from localspec.core.errors import BackendClosedError, InvalidRequestError
from localspec.core.exactness import judge as judge_exactness
from localspec.core.grammar import GRAMMAR_DEAD_END, GrammarConstraint, Grammars, json_schema_of
from localspec.core.protocol import DraftLengthPolicy
from localspec.core.sampling import KNOBS, SamplingConfig
from localspec.core.stats import Stats, Step
from localspec.core.templates import chat_tokens, normalize_messages, render_chat
from localspec.core.textstream import TextAssembler
from localspec.core.validate import chat_as_prompt, check_cancel, check_limits, clean_text
from localspec.drafters import Drafter
from localspec.strategies import Plan


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


@dataclass(frozen=True)
class Finished:
    text: str
    stats: Stats
    finish_reason: str


Event = TextDelta | Finished


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str


@dataclass(frozen=True)
class Prompt:
    """A prompt a runtime has checked and tokenized (Runtime.prepare). stream() and generate()
    take it as prompt= and use its ids as they are: a server tokenizes each request once."""

    ids: tuple[int, ...]


@dataclass(eq=False)
class _Turn:
    """A request holding the runtime: the thread that last used it, its events (None for
    remember()) and the thread inside it now. The runtime refers to this, never to the Stream
    around it, so a Stream its caller drops is freed at once, and freeing it ends the turn."""

    thread: int
    events: Generator[Event, None, None] | None = None
    busy: int | None = None  # the thread inside next() or remember(): the turn ends after it
    over: bool = False


class Stream:
    """One request's events: TextDelta as text becomes final, then one Finished. It holds the
    runtime from stream() until it ends: read to its Finished event, close()d, left by a `with`
    block, or dropped by its caller (CPython frees it at once, and that closes it)."""

    def __init__(self, runtime: Runtime, turn: _Turn) -> None:
        self._runtime = runtime
        self._turn = turn

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Event:
        return self._runtime._next(self._turn)

    def close(self) -> None:
        """End the request and release the runtime; when another thread is reading the stream,
        after the step in flight. Closing twice is harmless."""
        self._runtime._end(self._turn)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._turn.over:
            self.close()


class Runtime:
    """A loaded target with its drafter. One request at a time, under one lock: calls from
    other threads wait their turn; a new call in the thread of an unfinished stream ends that
    stream, and a Stream its caller drops is closed when it is freed."""

    def __init__(self, plan: Plan) -> None:
        """plan: a strategy resolved for its target (localspec.strategies.resolve or plan)."""
        self.plan = plan
        self.target = plan.target
        self.draft = plan.draft
        self.label = plan.label
        # Earlier requests' text, which n-gram lookup searches beside the request's own.
        self.memory = plan.memory
        self.drafter: Drafter = plan.drafter
        # Built on first use, so a request that is refused (a prompt longer than the context)
        # is refused before a calibration it does not need.
        self._policy: DraftLengthPolicy | None = None
        self.engine = Engine(plan.target, plan.drafter, free_drafter=plan.free, lookup=plan.lookup)
        # One lock, taken by its C methods where a step passes (the Condition's own are Python
        # calls), and a count of the threads waiting on it, so a step notifies only when one does.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._owner: _Turn | None = None  # the request holding the runtime
        self._closed = False
        # The cost curve of the policy built here (one set from outside is not remembered).
        self._costs: CostCurve | None = None
        self._drift_noted = False
        self._grammars: Grammars | None = None  # the target's grammar tokenizer, built on first use

    @property
    def strategy(self) -> str:
        """The strategy its plan was built by, "auto" resolved."""
        return self.plan.strategy

    @property
    def policy(self) -> DraftLengthPolicy:
        if self._policy is None:
            self._policy, priced = self.plan.policy()
            self._costs = priced.costs if priced is not None else None
            if priced is not None:  # trees where this machine's curve says they pay
                attach_trees(self.engine, priced)
        return self._policy

    @policy.setter
    def policy(self, value: DraftLengthPolicy) -> None:
        self._policy = value

    # -- requests ---------------------------------------------------------------------------

    def prompt_tokens(
        self, prompt: str | Sequence[int] | None = None, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """prompt is text, or token ids as given (a fill-in-the-middle prompt's control tokens),
        or a chat given in messages' place."""
        prompt, messages = chat_as_prompt(prompt, messages)
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("give either prompt= (plain text) or messages= (a chat), not both or neither")
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
        response_format: Mapping[str, Any] | None = None,
        json_schema: Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> Stream:
        """A Stream of TextDelta events as text becomes final, then one Finished event. It
        takes the runtime now (waiting while another thread's request runs) and keeps it until
        it ends: close() it, or use `with`, to stop early. Setting `cancel` ends the request at
        the next prompt chunk or verify step (finish reason "cancelled"), so another thread can
        stop even a long prompt evaluation. sampling defaults to SamplingConfig(); knobs
        (temperature=0, seed=1...) change its fields. response_format (OpenAI's shapes:
        {"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": ...}}) or
        json_schema (a JSON schema itself) constrain the answer to that JSON (see constraint())."""
        self._check_open()
        check_cancel(cancel)
        cfg = sampling_config(sampling, knobs)
        constraint = self.constraint(response_format, json_schema)
        if constraint is not None:
            if cfg.constraint is not None:
                raise InvalidRequestError("give response_format/json_schema or sampling.constraint, not both")
            cfg = replace(cfg, constraint=constraint)
        max_tokens, stop = check_limits(max_tokens, stop)
        if isinstance(prompt, Prompt):  # checked and tokenized by prepare(): not again
            if messages is not None:
                raise InvalidRequestError("give either prompt= or messages=, not both")
            tokens = list(prompt.ids)
            check_fits(tokens, self.target.info.n_ctx)
        else:
            tokens = list(self.prepare(prompt, messages).ids)
        events = self._run(tokens, max_tokens, cfg, stop, cancel)
        return Stream(self, self._take(events))

    def generate(
        self,
        prompt: str | Sequence[int] | Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        response_format: Mapping[str, Any] | None = None,
        json_schema: Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> Completion:
        """stream()'s answer in one piece."""
        tokens: list[int] = []
        with self.stream(
            prompt,
            messages=messages,
            max_tokens=max_tokens,
            stop=stop,
            cancel=cancel,
            sampling=sampling,
            response_format=response_format,
            json_schema=json_schema,
            **knobs,
        ) as events:
            for event in events:
                if isinstance(event, TextDelta):
                    tokens.extend(event.tokens)
                else:
                    return Completion(event.text, tokens, event.stats, event.finish_reason)
        raise AssertionError("a stream always ends with a Finished event")

    @property
    def grammars(self) -> Grammars:
        """The target's grammar engine (llguidance's tokenizer, one pass over the vocabulary,
        built on first use), which compiles the constraints requests ask for."""
        if self._grammars is None:
            self._grammars = Grammars(self.target)
        return self._grammars

    def constraint(
        self, response_format: Mapping[str, Any] | None = None, json_schema: Mapping[str, Any] | None = None
    ) -> GrammarConstraint | None:
        """A fresh constraint for one request (it keeps that request's grammar state): the JSON
        an OpenAI response_format or a JSON schema asks for; None for free text. A schema that
        cannot be compiled raises InvalidRequestError saying why."""
        if response_format is not None and json_schema is not None:
            raise InvalidRequestError("give response_format= or json_schema=, not both")
        if json_schema is not None:
            if not isinstance(json_schema, Mapping):
                raise InvalidRequestError(
                    f"json_schema must be a dict (a JSON schema), got {type(json_schema).__name__}",
                    'e.g. json_schema={"type": "object", "properties": {"name": {"type": "string"}}}',
                )
            schema = json_schema_of({"type": "json_schema", "json_schema": {"schema": json_schema}})
            return None if schema is None else self.grammars.json_schema(schema, "json_schema")
        if response_format is None:
            return None
        return self.grammars.constraint(response_format)

    def _run(
        self,
        tokens: list[int],
        max_tokens: int,
        cfg: SamplingConfig,
        stop: Sequence[str],
        cancel: threading.Event | None,
    ) -> Generator[Event, None, None]:
        said = list(tokens)  # the prompt, then the answer: what the memory keeps
        try:
            rng = np.random.default_rng(cfg.seed)
            stats = Stats(strategy=self.label)
            text = TextAssembler(self.target.token_bytes, stop)
            steps = self.engine.generate(
                tokens, max_tokens, cfg, self.policy, stats, rng, cancel.is_set if cancel is not None else None
            )
            for step in steps:
                said.extend(step.tokens)
                delta = text.push(step.tokens)
                n = step.n_from_draft
                flags = (True,) * n + (False,) * (len(step.tokens) - n)
                yield TextDelta(delta, step.tokens, flags, step, stats)
                if text.stopped:
                    stats.finish_reason = "stop"
                    break
            if (busy := threads_notice(self.target.capabilities)) is not None and busy not in stats.notices:
                stats.notices.append(busy)  # a busy machine, not the drafter, may be why this was slow
            judge_exactness(stats, self.target.capabilities.exactness, cfg.greedy)
            tail = text.flush()
            if tail:
                yield TextDelta(tail, (), (), None, stats)
            if stats.finish_reason == "stop" and _dead_end(cfg, stats.generated_tokens):
                stats.finish_reason = GRAMMAR_DEAD_END  # the grammar allowed nothing more: not a stop
            yield Finished(text.text, stats, stats.finish_reason)
        finally:
            if self.memory is not None:
                self.memory.add(said)
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
        turn = self._take(None)  # refuses a closed runtime
        try:
            self.memory.add(self.prompt_tokens(prompt, messages))
        finally:
            with self._cond:
                turn.busy = None
                self._finish(turn)

    # -- one request at a time --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("this runtime was closed", "load the model again with localspec.load()")

    def _take(self, events: Generator[Event, None, None] | None) -> _Turn:
        """Wait for the runtime and hold it: a stream's events, or remember() (events None,
        busy until it returns)."""
        me = threading.get_ident()
        with self._cond:
            while (owner := self._owner) is not None:
                if owner.busy == me:
                    raise InvalidRequestError(
                        "a request cannot start inside another one in the same thread",
                        "finish or close the running stream first, or start the request from another thread",
                    )
                if owner.thread == me and owner.busy is None:
                    self._end(owner)  # this thread left its own stream unfinished: it cannot be reading it
                else:
                    self._wait()
            self._check_open()
            turn = self._owner = _Turn(me, events, busy=me if events is None else None)
            return turn

    def _next(self, turn: _Turn) -> Event:
        """A stream's next event; the turn ends with the Finished event, an error or Ctrl+C."""
        me = threading.get_ident()
        with self._lock:
            if turn.over or turn.events is None:
                raise StopIteration
            if turn.busy is not None:
                raise InvalidRequestError(
                    "this stream is already being read by another thread", "read a stream from one thread at a time"
                )
            turn.busy = turn.thread = me
            events = turn.events
        try:
            event = next(events)
            if isinstance(event, Finished):
                events.close()  # runs the request's bookkeeping now, not at the caller's next call
        except BaseException:  # StopIteration, an error or KeyboardInterrupt: the generator is done
            with self._lock:
                turn.busy = None
                self._finish(turn)
            raise
        with self._lock:
            turn.busy = None
            if isinstance(event, Finished):
                self._finish(turn)
            elif self._waiting:  # a close() from another thread waits for this step
                self._cond.notify_all()
        return event

    def _wait(self) -> None:
        """Wait for the runtime's state to change (the lock held)."""
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def _end(self, turn: _Turn) -> None:
        """End a turn from outside it: after the step another thread has in flight, close its
        events (the request's bookkeeping runs) and release the runtime."""
        me = threading.get_ident()
        with self._cond:
            while turn.busy is not None and not turn.over:
                if turn.busy == me:
                    raise InvalidRequestError(
                        "a stream cannot be closed from inside its own step", "close it once the event is returned"
                    )
                self._wait()
            if turn.over:
                return
            turn.over = True  # first: a stream freed during the close below must not close it again
            try:
                if turn.events is not None:
                    turn.events.close()
            finally:
                self._finish(turn)

    def _finish(self, turn: _Turn) -> None:
        """Release the runtime from a turn that is over (self._cond held)."""
        turn.over = True
        turn.events = None  # frees the request's frames now
        if self._owner is turn:
            self._owner = None
        self._cond.notify_all()

    def idle_drafter_note(self, stats: Stats) -> str | None:
        """Why a draft model drafted nothing in a request, in the costs the controller weighed
        (None where it drafted, or no model drafts)."""
        prices = self._policy.prices() if self._policy is not None else None
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
        """Free the models. A stream still open is ended first (one running in another
        thread after its step in flight), so no model is freed under a thread that uses it."""
        with self._cond:
            if self._closed:
                return
            while (owner := self._owner) is not None:
                self._end(owner)
            self._closed = True
        self.drafter.close()
        self.target.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dead_end(cfg: SamplingConfig, generated: int) -> bool:
    """Whether an answer of `generated` tokens ended because its grammar allowed nothing more."""
    return isinstance(cfg.constraint, GrammarConstraint) and cfg.constraint.ended_at_dead_end(generated)


def sampling_config(sampling: SamplingConfig | None, knobs: Mapping[str, Any]) -> SamplingConfig:
    """stream()/generate()'s sampling, with any knobs given as keywords applied to it."""
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise InvalidRequestError(f"sampling must be a SamplingConfig, got {sampling!r}")
    unknown = sorted(set(knobs) - set(KNOBS))
    if "stream" in unknown:  # openai's and ollama's flag: here streaming is its own method
        raise InvalidRequestError("generate() has no stream option", "call runtime.stream(...) for events as they come")
    if unknown:
        takes = ", ".join(
            ["max_tokens", "stop", "cancel", "sampling", "response_format", "json_schema", *sorted(KNOBS)]
        )
        raise InvalidRequestError(f"unknown option {unknown[0]!r}", f"generate() and stream() take: {takes}")
    return replace(sampling or SamplingConfig(), **knobs)
