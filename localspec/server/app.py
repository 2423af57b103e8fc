"""The HTTP side: OpenAI's routes over the generation worker, with streaming as server-sent
events, OpenAI error objects and /metrics; the layers before a route (the API key, CORS, the
Host check, the log) are in server/middleware.py, server/cors.py and server/hosts.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from localspec.api import Finished, TextDelta
from localspec.core.errors import ContextFullError, InvalidRequestError, LocalspecError, PairMismatchError
from localspec.core.sampling import LogprobRecorder, TokenLogprob
from localspec.core.stats import Stats
from localspec.core.tools import CallFilter, ToolRequest, ToolRequestError, parse_tool_calls, tool_request
from localspec.server import schemas
from localspec.server.cors import CorsRule, JsonCors
from localspec.server.grammar import GrammarRequest
from localspec.server.hosts import HostCheck, HostPolicy
from localspec.server.image_urls import ImageUrls, fetch_image_urls
from localspec.server.metrics import CONTENT_TYPE_LATEST, exposition
from localspec.server.middleware import BodyLimit, JsonBody, KeyCheck, RequestLog, error_response, key_given
from localspec.server.schemas import ApiError, ChatRequest, CompletionRequest, GenerationRequest
from localspec.server.speculation import requested
from localspec.server.worker import Item, Job, Worker, stream_kwargs

UNLIMITED = 1 << 30  # no max_tokens: generate until a stop or the context is full


@dataclass
class Settings:
    api_key: str | None = None
    cors_origins: Sequence[str] = ()
    allowed_hosts: Sequence[str] = ()  # Host names answered besides loopback and the bound host
    keepalive_s: float = 10.0  # SSE comment while a request waits or its prompt is evaluated
    max_body_bytes: int = 8 << 20
    # A request's cache_prompt when it sends none: False reuses only a prefix evaluated as a
    # fresh request would, so answers do not depend on earlier requests (reuse_prefix "exact").
    cache_prompt: bool = False
    # False: no prefix is reused across requests, whatever a request asks (serve --no-prefix-cache).
    prefix_cache: bool = True
    # Where request lines go: the logger "localspec.server" (an app's server writes nothing on
    # its stdout or stderr); `localspec serve` passes its own, which prints.
    log: Callable[[str], None] = logging.getLogger("localspec.server").info
    # An image_url part's http(s) URL: refused unless allowed (serve --allow-image-urls).
    image_urls: ImageUrls = field(default_factory=ImageUrls)


@dataclass
class Catalog:
    """Which model ids this server answers to: the one it serves and the pulled pairs."""

    served: str
    backend: str = "llamacpp"
    pairs: bool = True  # whether pairs of models.toml may be loaded on request
    started: int = field(default_factory=schemas.now)

    def pulled(self) -> list[str]:
        if not self.pairs:
            return []
        from localspec.models.pull import is_pulled
        from localspec.models.registry import load_registry

        return [p.id for p in load_registry().pairs.values() if is_pulled(p, self.backend)]

    def resolve(self, name: str | None, loaded: str) -> str:
        """The pair id to run a request on; 404 naming `localspec pull` when it is not here."""
        model, unknown = self.answer(name, loaded)
        if unknown:
            hint = (
                f"this server serves {self.served!r} only"
                if not self.pairs
                else "`localspec list` shows the pairs; fetch one with `localspec pull PAIR`"
            )
            raise _no_model(str(name), hint)
        return model

    def answer(self, name: str | None, loaded: str) -> tuple[str, bool]:
        """The pair id to run a request on, and whether `name` is no pair at all (then the
        loaded model answers, as llama-server and Ollama answer an app that sends
        `gpt-4o-mini`); a pair that is known but not pulled is a 404 naming the pull."""
        if not name or name in (loaded, self.served):
            return name or loaded, False
        if not self.pairs:
            return loaded, True
        from localspec.models.pull import is_pulled, pull_command
        from localspec.models.registry import UnknownPairError, load_registry

        try:
            pair = load_registry().pair(name)
        except UnknownPairError:
            return loaded, True
        if pair.id in (loaded, self.served):
            return pair.id, False
        if not is_pulled(pair, self.backend):
            raise _no_model(name, f"fetch it with: {pull_command(pair, self.backend)}")
        return pair.id, False


def _warnings(ignored: Sequence[str], asked: str | None, model: str, no_effect: Sequence[str] = ()) -> dict[str, str]:
    """The warning header: fields ignored, fields with no effect here, a model name answered by
    another. ASCII only, as headers must be."""
    said = []
    if ignored:
        said.append(f"ignored fields with no equivalent here: {', '.join(ignored)}")
    if no_effect:
        said.append(f"fields with no effect here: {', '.join(no_effect)}")
    if asked is not None:
        said.append(f"model {asked!r} is not here; {model} answered")
    text = "; ".join(said).encode("ascii", "backslashreplace").decode()
    return {schemas.WARNING_HEADER: text} if said else {}


def _no_model(name: str, hint: str) -> ApiError:
    return ApiError(404, f"model {name!r} is not available here: {hint}", param="model", code="model_not_found")


def create_app(worker: Worker, catalog: Catalog, settings: Settings, bound_host: str = "127.0.0.1") -> FastAPI:
    """The app; an InvalidRequestError for a --cors-origin that is no origin."""
    cors = CorsRule.of(settings.cors_origins)
    key = None if settings.api_key is None else settings.api_key.encode("utf-8")
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)
    api = APIRouter()

    _add_info_routes(app, api, worker, catalog, key)
    _generate = _Generation(worker, catalog, settings)

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        ignored = body.refuse_unsupported()
        tools = tool_request(body.tools, body.tool_choice)
        messages = await fetch_image_urls(body.chat(), settings.image_urls)
        return await _generate(request, body, "chat", {"messages": messages, "tools": tools}, tools, ignored)

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        ignored = body.refuse_unsupported()
        return await _generate(request, body, "text", body.source(), None, ignored)

    app.include_router(api)
    _add_middlewares(app, settings, cors, bound_host)
    return app


def _add_info_routes(app: FastAPI, api: APIRouter, worker: Worker, catalog: Catalog, key: bytes | None) -> None:
    """/health and /metrics on the app (outside the key check), and the models on the API."""

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        # 503 until the model is loaded, as llama-server answers: a launcher polls this. With
        # a key set, only that much without it: which model runs and what waits is the key's.
        status = worker.status()
        code = 200 if status["status"] == "ok" else 503
        if key is not None and not key_given(request.scope["headers"], key):
            return JSONResponse({"status": status["status"]}, status_code=code)
        return JSONResponse(status, status_code=code)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(exposition(worker.metrics, worker.queue_by_model), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        loaded = worker.model_id
        ids = list(dict.fromkeys([loaded, catalog.served, *await run_in_threadpool(catalog.pulled)]))
        return {"object": "list", "data": [_model_card(i, catalog, loaded) for i in ids]}

    @api.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict[str, Any]:
        loaded = worker.model_id
        return _model_card(await run_in_threadpool(catalog.resolve, model_id, loaded), catalog, loaded)


@dataclass(frozen=True)
class _Generation:
    """What both generation routes do once their body is read: check the prompt, submit each
    choice as a job, and stream or collect the reply."""

    worker: Worker
    catalog: Catalog
    settings: Settings

    async def __call__(
        self,
        request: Request,
        body: GenerationRequest,
        kind: str,
        source: dict[str, Any],
        tools: ToolRequest | None,
        ignored: Sequence[str],
    ) -> Response:
        worker, catalog, settings = self.worker, self.catalog, self.settings
        model, unknown = await run_in_threadpool(catalog.answer, body.model, worker.model_id)
        speculating = requested(body)  # checked before the prompt, which takes longer
        asked = body.model if unknown else None
        limit = body.token_limit
        sampling = body.sampling()
        kwargs = stream_kwargs(
            max_tokens=UNLIMITED if limit is None else limit, stop=body.stops, sampling=sampling, **source
        )
        grammar = GrammarRequest.of(body.response_format, tools if tools is not None and tools.forced else None)
        cache_prompt = settings.cache_prompt if body.cache_prompt is None else body.cache_prompt
        # Reuse only a cached prefix evaluated as a fresh request would, so the answer does not
        # depend on earlier requests, unless cache_prompt asks for speed; nothing without a cache.
        kwargs["reuse_prefix"] = "none" if not settings.prefix_cache else "any" if cache_prompt else "exact"
        kwargs["speculation"] = speculating.speculation
        prompt = await run_in_threadpool(worker.check_prompt, model, kwargs, grammar)

        def make(index: int, emit: Callable[[Item], None]) -> Job:
            # Each choice its own seed (the next one), so that seeded choices differ and each is reproducible.
            seeded = sampling if index == 0 or sampling.seed is None else replace(sampling, seed=sampling.seed + index)
            return Job(
                model,
                {**kwargs, "sampling": seeded},
                emit,
                logprobs=body.logprob_top(),
                grammar=grammar,
                prompt=prompt,
                deltas=bool(body.stream),
            )

        first = _submit(worker, make, 0)
        reply = Reply(kind, model, request, tools, choices=body.choices, asked=asked)
        headers = _warnings(ignored, asked, model, speculating.no_effect)
        if body.stream:
            return StreamingResponse(
                _sse(reply, first, make, worker, body.include_usage, settings.keepalive_s),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
            )
        response = await _collect(reply, first, make, worker)
        response.headers.update(headers)
        return response


def _add_middlewares(app: FastAPI, settings: Settings, cors: CorsRule, bound_host: str) -> None:
    # Outermost last: the log sees every answer, CORS answers preflights before the key check,
    # and the key is checked before a body is read.
    app.add_middleware(JsonBody)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(KeyCheck, key=settings.api_key)
    app.add_middleware(JsonCors, rule=cors)
    # Before CORS: a rebinding page is its own origin, so only the names tell it apart.
    policy = HostPolicy.of(bound_host, settings.allowed_hosts)
    app.add_middleware(HostCheck, policy=policy, cors=cors)
    app.add_middleware(RequestLog, write=settings.log)


def _model_card(model_id: str, catalog: Catalog, loaded: str) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": catalog.started,
        "owned_by": "localspec",
        "loaded": model_id == loaded,
    }


# -- answers --------------------------------------------------------------------------------

MakeJob = Callable[[int, Callable[[Item], None]], Job]  # choice index, emit -> its job


def _submit(worker: Worker, make: MakeJob, index: int) -> tuple[Job, asyncio.Queue[Item]]:
    """Choice `index`'s job, queued, and the queue its events arrive in."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Item] = asyncio.Queue()

    def emit(item: Item) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
            loop.call_soon_threadsafe(events.put_nowait, item)

    job = make(index, emit)
    worker.submit(job)
    return job, events


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
    created: int = field(default_factory=schemas.now)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.id = schemas.new_id("chatcmpl" if self.kind == "chat" else "cmpl")

    @property
    def prompt_param(self) -> str:
        """The field that holds the prompt, which a prompt too long for the context names."""
        return "messages" if self.kind == "chat" else "prompt"

    def whole(self, answers: Sequence[tuple[Finished, list[TokenLogprob] | None]]) -> dict[str, Any]:
        shape = schemas.chat_completion if self.kind == "chat" else schemas.text_completion
        stats = schemas.combined([done.stats for done, _ in answers])
        whole: dict[str, Any] = {}
        for index, (done, logprobs) in enumerate(answers):
            one = shape(self.id, self.created, self.model, done.text, done.finish_reason, stats, logprobs)
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
            lp = schemas.chat_logprobs(logprobs)
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            lp = schemas.text_logprobs(logprobs, offset)
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


async def _collect(reply: Reply, first: tuple[Job, asyncio.Queue[Item]], make: MakeJob, worker: Worker) -> Response:
    """Whole answers, one choice after another; a client that leaves first ends its generation."""
    answers: list[tuple[Finished, list[TokenLogprob] | None]] = []
    for index in range(reply.choices):
        job, events = first if index == 0 else _submit(worker, make, index)
        done = await _collect_one(reply, job, events, worker)
        if done is None:
            return Response(status_code=499)  # nobody reads it: the connection is gone
        answers.append((done, LogprobFeed(job.recorder).covering(len(done.text.encode()))))
    reply.note(schemas.combined([done.stats for done, _ in answers]))
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
                error = _api_error(item, reply.prompt_param)
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


async def _sse(
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
                job, events = first if index == 0 else _submit(worker, make, index)
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
            stats = schemas.combined(done)
            reply.note(stats)
            if include_usage:
                last = {**reply.chunk(None), "choices": [], "usage": schemas.usage(stats)}
                yield _event({**last, "speculation": schemas.speculation(stats)})
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
    """One choice's events, from its job and the queue it feeds (_submit); its stats are
    appended to `done` once it finished."""
    job, events = submitted
    calls = None if reply.tools is None else CallFilter(reply.tools.names)
    stream = ChoiceStream(reply, index, LogprobFeed(job.recorder), calls)
    first = True
    while True:
        try:
            item = await asyncio.wait_for(events.get(), keepalive)
        except asyncio.TimeoutError:
            yield b": keep-alive\n\n"
            continue
        if isinstance(item, BaseException):
            error = _api_error(item, reply.prompt_param)
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
        finish = called or schemas.FINISH_REASONS.get(item.finish_reason, item.finish_reason)
        last = reply.chunk(None, finish, index=index)
        yield _event({**last, **usage_none, "speculation": schemas.speculation(item.stats)})
        done.append(item.stats)
        return


# -- errors ---------------------------------------------------------------------------------


def _api_error(exc: BaseException, prompt_param: str = "messages") -> ApiError:
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


def _prompt_param(request: Request) -> str:
    return "prompt" if request.url.path.endswith("/v1/completions") else "messages"


def _add_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        return error_response(_api_error(exc, _prompt_param(request)))

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {"msg": "invalid request", "loc": ()}
        if first.get("type") == "json_invalid":
            reason = dict(first.get("ctx") or {}).get("error", "")
            return error_response(ApiError(400, f"the body is not valid JSON ({reason}): send a JSON object"))
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        where = f"'{param}': " if param else ""
        return error_response(ApiError(400, f"{where}{first['msg']}", param=param, code="invalid_value"))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = ApiError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return error_response(error)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(LocalspecError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, api_error)
