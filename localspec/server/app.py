"""The HTTP side: OpenAI's routes over the generation worker, with streaming as server-sent
events, OpenAI error objects and /metrics; the layers before a route (the API key, CORS, the
Host check, the log) are in server/middleware.py, server/cors.py and server/hosts.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from localspec.common.tools import ToolRequest, tool_request
from localspec.core.errors import LocalspecError
from localspec.server import responses, schemas
from localspec.server.cors import CorsRule, JsonCors
from localspec.server.grammar import GrammarRequest
from localspec.server.hosts import HostCheck, HostPolicy
from localspec.server.image_urls import ImageUrls, fetch_image_urls
from localspec.server.metrics import CONTENT_TYPE_LATEST, exposition
from localspec.server.middleware import BodyLimit, JsonBody, KeyCheck, RequestLog, error_response, key_given
from localspec.server.replies import Reply, api_error_of, collect, sse, submit
from localspec.server.request_prompts import stream_kwargs
from localspec.server.schemas import ApiError, ChatRequest, CompletionRequest, GenerationRequest
from localspec.server.speculation import requested
from localspec.server.worker import Item, Job, Worker

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
    started: int = field(default_factory=responses.now)

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
        return Response(
            exposition(worker.metrics, worker.queue_by_model, worker.passes_by_model), media_type=CONTENT_TYPE_LATEST
        )

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

        first = submit(worker, make, 0)
        reply = Reply(kind, model, request, tools, choices=body.choices, asked=asked)
        headers = _warnings(ignored, asked, model, speculating.no_effect)
        if body.stream:
            return StreamingResponse(
                sse(reply, first, make, worker, body.include_usage, settings.keepalive_s),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
            )
        response = await collect(reply, first, make, worker)
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


def _prompt_param(request: Request) -> str:
    return "prompt" if request.url.path.endswith("/v1/completions") else "messages"


def _add_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        return error_response(api_error_of(exc, _prompt_param(request)))

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
