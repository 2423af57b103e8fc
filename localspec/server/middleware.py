"""The server's ASGI layers that run before a route: the API key, the body's size and type,
and one log line per request (the Host/Origin check is server/hosts.py, CORS server/cors.py)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.server.schemas import ApiError

KEY_HEADERS = (b"authorization", b"x-api-key")
OPEN_PATHS = ("/health",)  # answered without the key; /health then says only whether the server lives


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def key_given(headers: list[tuple[bytes, bytes]], key: bytes) -> bool | None:
    """Whether the request carries the key, as 'Authorization: Bearer KEY' (OpenAI's SDKs) or
    'x-api-key: KEY' (Anthropic's convention, which some clients send); None: no key header at
    all. The header's raw bytes are compared with the key's UTF-8, so a key that is not ASCII
    works from any client that sends it as UTF-8."""
    sent = {k.lower(): v for k, v in headers if k.lower() in KEY_HEADERS}
    if not sent:
        return None
    scheme, _, token = sent.get(b"authorization", b"").partition(b" ")
    bearer = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)
    return bearer or hmac.compare_digest(sent.get(b"x-api-key", b"").strip(), key)


class KeyCheck:
    """401 for a request without the API key on every route but /health, before its body is
    read: whoever lacks the key learns nothing of how a body would be parsed."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.key = None if key is None else key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is not None and scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = key_given(scope["headers"], self.key)
            if not given:
                error = ApiError(
                    401,
                    "a valid API key is required: send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY')"
                    if given is None
                    else "the API key is not valid",
                    code="invalid_api_key",
                )
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for a request body over the limit, before any of it is parsed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                error = ApiError(413, f"the request body is over {self.limit} bytes", code="body_too_large")
                await error_response(error)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()  # after the body: waits for the client to disconnect

        await self.app(scope, replay, send)


class JsonBody:
    """Every POST body is read as JSON whatever its Content-Type says, as llama-server and
    Ollama read it: `curl -d` sends form encoding, and some clients send text/plain."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class RequestLog:
    """One line per request, written when its answer is complete."""

    def __init__(self, app: ASGIApp, write: Callable[[str], None]) -> None:
        self.app = app
        self.write = write

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        state: dict[str, Any] = scope.setdefault("state", {})

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            note = state.get("log_note", "")
            seconds = time.perf_counter() - started
            self.write(f"{scope['method']} {scope['path']} {status or '-'} {seconds:.2f}s {note}".rstrip())
