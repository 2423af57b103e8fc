"""Which browser origins may call the server: one rule, read from --cors-origin, that decides
both a preflight and the request it announces.

An origin is compared as its scheme, host and port (lowercased, the scheme's default port
dropped), so `https://App.example:443/` given at the command line matches the
`https://app.example` a browser sends. `*` allows every origin, for preflights and requests
alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from localspec.core.errors import InvalidRequestError
from localspec.server.schemas import ApiError

ANY_ORIGIN = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(value: str) -> str | None:
    """scheme://host[:port] as browsers serialise an origin (lowercase, no default port, no
    trailing slash); None where `value` is no origin (a path, a query, no host)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:  # a port that is no number, a bracket left open
        return None
    host = parts.hostname
    if not parts.scheme or not host or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    scheme = parts.scheme.lower()
    name = f"[{host}]" if ":" in host else host
    return f"{scheme}://{name}" if port is None or DEFAULT_PORTS.get(scheme) == port else f"{scheme}://{name}:{port}"


@dataclass(frozen=True)
class CorsRule:
    """The origins --cors-origin allows, normalised; any: '*' was given."""

    origins: frozenset[str] = frozenset()
    any: bool = False

    @classmethod
    def of(cls, given: Iterable[str]) -> CorsRule:
        """The rule for --cors-origin's values; an InvalidRequestError naming a value that is
        no origin (a URL with a path, say), so a typo is said at start rather than refusing
        every browser later."""
        origins = set()
        values = list(given)
        for value in values:
            if value.strip() == ANY_ORIGIN:
                continue
            origin = normalize_origin(value)
            if origin is None:
                raise InvalidRequestError(
                    f"--cors-origin {value!r} is not an origin",
                    "give scheme://host[:port] as the browser shows it, e.g. https://app.example or http://localhost:5173",
                )
            origins.add(origin)
        return cls(frozenset(origins), any=any(v.strip() == ANY_ORIGIN for v in values))

    def allows(self, origin: str | None) -> bool:
        if origin is None:
            return False
        return self.any or normalize_origin(origin) in self.origins

    def warning(self) -> str | None:
        """What to say at start where every origin is allowed."""
        if not self.any:
            return None
        return (
            "warning: --cors-origin '*' lets every web page the user opens send requests to this server and read "
            "the answers; name the app's origin instead (--cors-origin https://app.example)"
        )


class JsonCors(CORSMiddleware):
    """Starlette's CORS deciding by the CorsRule, refusing a preflight with an OpenAI error
    object."""

    def __init__(self, app: ASGIApp, rule: CorsRule) -> None:
        super().__init__(
            app,
            allow_origins=[ANY_ORIGIN] if rule.any else sorted(rule.origins),
            allow_methods=["GET", "POST"],
            # Any request header: the openai SDKs send their own (x-stainless-*, openai-organization,
            # ...), the origins are what --cors-origin limits, and llama-server allows them all too.
            allow_headers=["*"],
        )
        self.rule = rule

    def is_allowed_origin(self, origin: str) -> bool:
        return self.rule.allows(origin)

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        origin = request_headers.get("origin")
        reason = bytes(response.body).decode()
        hint = "" if self.rule.any or self.rule.origins else ": CORS is off; start the server with --cors-origin ORIGIN"
        error = ApiError(400, f"{reason} (origin {origin!r}){hint}", code="cors_refused")
        headers = {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-") or k == "vary"}
        return JSONResponse(error.body(), status_code=400, headers=headers)
