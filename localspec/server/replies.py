"""A generation route's reply: the whole answer as one OpenAI object, or its choices as
server-sent events, each choice a job on the worker, with usage, logprobs and tool calls."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from localspec.api import Finished, TextDelta
from localspec.common.tools import CallFilter, ToolRequest, ToolRequestError, parse_tool_calls
from localspec.core.errors import ContextFullError, InvalidRequestError, LocalspecError, PairMismatchError
from localspec.core.sampling import LogprobRecorder, TokenLogprob
from localspec.core.stats import Stats
from localspec.server import responses
from localspec.server.schemas import ApiError
from localspec.server.worker import Item, Job, Worker

MakeJob = Callable[[int, Callable[[Item], None]], Job]  # choice index, emit -> its job


def submit(worker: Worker, make: MakeJob, index: int) -> tuple[Job, asyncio.Queue[Item]]:
    """Choice `index`'s job, queued, and the queue its events arrive in."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Item] = asyncio.Queue()
    mail = _MAILBOXES.get(loop) or _MAILBOXES.setdefault(loop, _Mailbox(loop))
    job = make(index, lambda item: mail.post(events, item))
    worker.submit(job)
    return job, events


class _Mailbox:
    """Events from the generation threads to one event loop's queues. Lanes that share a pass
    emit their tokens together, so the loop is woken once for all that arrived since it last
    ran, not once an event: each wake-up costs the loop a round and the GIL that the lanes
    need before the next pass (2-5 % of the CPU a token with two streams, benchmarks/concurrency.py)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Item], Item]] = []

    def post(self, events: asyncio.Queue[Item], item: Item) -> None:
        with self._lock:
            self._items.append((events, item))
            if len(self._items) > 1:  # a wake-up is on its way and will take this one too
                return
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the event loop has closed: nobody is listening
            with self._lock:
                self._items.clear()

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for events, item in items:
            events.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()


@dataclass
class Reply:
    """One request's answer in OpenAI's shape: chat or text completion, with `choices` choices."""

    kind: str  # "chat" or "text"
    model: str
    request: Request
    tools: ToolRequest | None = None  # offered: the answer's calls become tool_calls
    choices: int = 1
    asked: str | None = None  # the model name asked for where another answered (an unknown name)
    id: str = ""
    created: int = field(default_factory=responses.now)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.id = responses.new_id("chatcmpl" if self.kind == "chat" else "cmpl")

    @property
    def prompt_param(self) -> str:
        """The field that holds the prompt, which a prompt too long for the context names."""
        return "messages" if self.kind == "chat" else "prompt"

    def whole(self, answers: Sequence[tuple[Finished, list[TokenLogprob] | None]]) -> dict[str, Any]:
        shape = responses.chat_completion if self.kind == "chat" else responses.text_completion
        stats = responses.combined([done.stats for done, _ in answers])
        whole: dict[str, Any] = {}
        for index, (done, logprobs) in enumerate(answers):
            one = shape(
                self.id, self.created, self.model, responses.Answered(done.text, done.finish_reason, logprobs), stats
            )
            choice = one["choices"][0]
            choice["index"] = index
            content, calls = (done.text, []) if self.tools is None else parse_tool_calls(done.text, self.tools.names)
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
            if whole:
                whole["choices"].append(choice)
            else:
                whole = one
        return whole

    def calls_chunk(self, calls: list[dict[str, Any]], index: int = 0) -> dict[str, Any]:
        delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
        return {**self.chunk(None), "choices": [{"index": index, "delta": delta, "finish_reason": None}]}

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        role: bool = False,
        logprobs: list[TokenLogprob] | None = None,
        offset: int = 0,
        index: int = 0,
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            lp = responses.chat_logprobs(logprobs)
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            lp = responses.text_logprobs(logprobs, offset)
            choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    def note(self, stats: Stats | None, outcome: str = "") -> None:
        """What the request log says about this answer."""
        who = self.model if self.asked is None else f"{self.model} (asked for {self.asked!r}, not here)"
        if stats is None:
            self.request.state.log_note = f"{who} {outcome}"
            return
        self.request.state.log_note = (
            f"{who} {stats.prompt_tokens}+{stats.generated_tokens} tokens "
            f"{stats.decode_tokens_per_s:.1f} tok/s acceptance {stats.drafter_acceptance_rate:.0%} "
            f"({stats.strategy}, {stats.tokens_per_step:.2f} tokens/step){outcome}"
        )


async def collect(reply: Reply, first: tuple[Job, asyncio.Queue[Item]], make: MakeJob, worker: Worker) -> Response:
    """Whole answers, one choice after another; a client that leaves first ends its generation."""
    answers: list[tuple[Finished, list[TokenLogprob] | None]] = []
    for index in range(reply.choices):
        job, events = first if index == 0 else submit(worker, make, index)
        done = await _collect_one(reply, job, events, worker)
        if done is None:
            return Response(status_code=499)  # nobody reads it: the connection is gone
        answers.append((done, LogprobFeed(job.recorder).covering(len(done.text.encode()))))
    reply.note(responses.combined([done.stats for done, _ in answers]))
    return JSONResponse(reply.whole(answers))


async def _collect_one(reply: Reply, job: Job, events: asyncio.Queue[Item], worker: Worker) -> Finished | None:
    """One choice's answer; None when the client left before it was done."""
    left = asyncio.ensure_future(_disconnected(reply.request))
    finished = False
    try:
        while True:
            get = asyncio.ensure_future(events.get())
            await asyncio.wait({get, left}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                reply.note(None, f"client left after {job.steps} steps")
                return None
            item = get.result()
            if isinstance(item, BaseException):
                finished = True
                error = api_error_of(item, reply.prompt_param)
                reply.note(None, f"failed: {error.message}")
                raise error from item
            if isinstance(item, Finished):
                finished = True
                return item
    finally:
        left.cancel()
        if not finished:
            worker.withdraw(job)


@dataclass
class LogprobFeed:
    """The recorded logprobs, handed out as the text they produced is sent: a token whose text
    is held back (half a character, a possible stop string) goes with the text that releases
    it, and a token past a stop string or a cut character is never sent. None: not asked for."""

    recorder: LogprobRecorder | None
    covered: int = 0  # bytes of text the entries handed out so far produced

    def covering(self, sent: int) -> list[TokenLogprob] | None:
        """The next entries, up to those that produced the first `sent` bytes of the text."""
        if self.recorder is None:
            return None
        out = []
        while self.covered < sent:
            entry = self.recorder.take(1)
            if not entry:
                break
            out.append(entry[0])
            self.covered += len(entry[0].text)
        return out


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class ChoiceStream:
    """One choice's streamed text: what was sent (which the logprobs sent must cover) and,
    where tools were offered, what is held back because it could still become a call."""

    reply: Reply
    index: int
    feed: LogprobFeed
    calls: CallFilter | None
    sent: bytes = b""

    def text(self, text: str) -> dict[str, Any] | None:
        """The chunk for a piece of text as it comes (None: nothing to send yet)."""
        if self.calls is not None:
            text = self.calls.push(text)
        if not text:
            return None
        offset = len(self.sent.decode(errors="replace"))
        self.sent += text.encode()
        logprobs = self.feed.covering(len(self.sent))
        return self.reply.chunk(text, logprobs=logprobs, offset=offset, index=self.index)

    def end(self) -> tuple[list[dict[str, Any]], str | None]:
        """The chunks of what was held back, and "tool_calls" where it held calls (None: the
        engine's own finish reason)."""
        if self.calls is None:
            return [], None
        content, calls = self.calls.finish()
        chunks = [self.reply.chunk(content, index=self.index)] if content else []
        if calls:
            chunks.append(self.reply.calls_chunk(calls, self.index))
        return chunks, "tool_calls" if calls else None


async def sse(
    reply: Reply,
    first: tuple[Job, asyncio.Queue[Item]],
    make: MakeJob,
    worker: Worker,
    include_usage: bool,
    keepalive: float,
) -> AsyncIterator[bytes]:
    """data: events, choice after choice, a comment every `keepalive` seconds while nothing
    else is sent, a final [DONE]. A client that leaves cancels this generator, which ends its
    generation."""
    usage_none = {"usage": None} if include_usage else {}
    done: list[Stats] = []
    job = first[0]
    finished = False
    try:
        for index in range(reply.choices):
            try:
                job, events = first if index == 0 else submit(worker, make, index)
            except ApiError as error:
                yield _event(error.body())
                finished = True
                break
            finished = False
            async for event in _choice_events(reply, index, (job, events), usage_none, keepalive, done):
                yield event
            finished = True
            if len(done) <= index:  # it failed: the error was sent
                break
        if len(done) == reply.choices:
            stats = responses.combined(done)
            reply.note(stats)
            if include_usage:
                last = {**reply.chunk(None), "choices": [], "usage": responses.usage(stats)}
                yield _event({**last, "speculation": responses.speculation(stats)})
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            reply.note(None, f"client left after {job.steps} steps")
            worker.withdraw(job)


async def _choice_events(
    reply: Reply,
    index: int,
    submitted: tuple[Job, asyncio.Queue[Item]],
    usage_none: Mapping[str, Any],
    keepalive: float,
    done: list[Stats],
) -> AsyncIterator[bytes]:
    """One choice's events, from its job and the queue it feeds (submit); its stats are
    appended to `done` once it finished."""
    job, events = submitted
    calls = None if reply.tools is None else CallFilter(reply.tools.names)
    stream = ChoiceStream(reply, index, LogprobFeed(job.recorder), calls)
    first = True
    while True:
        try:
            # An event already there is taken as it is: wait_for costs the loop a task and a timer.
            item = events.get_nowait() if not events.empty() else await asyncio.wait_for(events.get(), keepalive)
        except asyncio.TimeoutError:
            yield b": keep-alive\n\n"
            continue
        if isinstance(item, BaseException):
            error = api_error_of(item, reply.prompt_param)
            reply.note(None, f"failed: {error.message}")
            yield _event(error.body())
            return
        if first and reply.kind == "chat":
            yield _event({**reply.chunk(None, role=True, index=index), **usage_none})
        first = False
        # The job's recorder exists once the worker started it, which the first event proves.
        stream.feed.recorder = stream.feed.recorder or job.recorder
        if isinstance(item, TextDelta):
            chunk = stream.text(item.text) if item.text else None
            if chunk is not None:
                yield _event({**chunk, **usage_none})
            continue
        chunks, called = stream.end()
        for chunk in chunks:
            yield _event({**chunk, **usage_none})
        finish = called or responses.FINISH_REASONS.get(item.finish_reason, item.finish_reason)
        last = reply.chunk(None, finish, index=index)
        yield _event({**last, **usage_none, "speculation": responses.speculation(item.stats)})
        done.append(item.stats)
        return


# -- errors ---------------------------------------------------------------------------------


def api_error_of(exc: BaseException, prompt_param: str = "messages") -> ApiError:
    """exc as an OpenAI error; prompt_param: the field holding the prompt on this route."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextFullError):
        return ApiError(400, _one_line(exc), param=prompt_param, code="context_length_exceeded")
    from localspec.models.pull import NotPulledError
    from localspec.models.registry import UnknownPairError

    if isinstance(exc, NotPulledError | UnknownPairError):
        return ApiError(404, _one_line(exc), param="model", code="model_not_found")
    if isinstance(exc, ToolRequestError):
        return ApiError(400, _one_line(exc), param=exc.param)
    if isinstance(exc, InvalidRequestError | PairMismatchError):
        return ApiError(400, _one_line(exc))
    if isinstance(exc, LocalspecError):
        return ApiError(500, _one_line(exc), type="server_error")
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")


def _one_line(exc: LocalspecError) -> str:
    """The message and its fix in one sentence: the CLI's `\n  -> fix` layout means nothing in JSON."""
    return exc.message if exc.hint is None else f"{exc.message}; {exc.hint}"
