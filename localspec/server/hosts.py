"""Which Host and Origin headers the server answers to: a defence against DNS rebinding.

A web page at http://evil.example:8000 whose name the attacker re-points at 127.0.0.1 reaches
this server from the user's browser as its own origin, so CORS does not stop it; its requests
still carry `Host: evil.example:8000`. Only names that cannot be re-pointed that way (loopback
addresses, `localhost`) and names the user gave (the bound --host, --allow-host) are answered.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from localspec.server.cors import CorsRule
from localspec.server.schemas import ApiError

WILDCARD_BINDS = ("", "0.0.0.0", "::")
ANY_HOST = "*"  # --allow-host '*': no check (behind a proxy that checks names itself)
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")


def host_name(value: str) -> str | None:
    """The name in a Host header or an authority ("name:port", "[::1]:port"), lowercased
    and without a trailing dot; None where it cannot be read."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        port = not rest or (rest[0] == ":" and rest[1:].isdigit())  # "[::1].evil.example" is no loopback
        return name if bracket and name and port else None
    name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    name = name.rstrip(".")
    return name or None


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.split("%", 1)[0])  # an IPv6 zone is not part of the address
    except ValueError:
        return None


def is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    address = _address(name)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback


@dataclass(frozen=True)
class HostPolicy:
    """Names answered besides loopback ones; any_address: any IP literal too (a wildcard bind:
    a browser sends an address only when it was pointed at that address, never by a name
    someone else controls)."""

    names: frozenset[str]
    any_address: bool = False
    open: bool = False

    @classmethod
    def of(cls, bound_host: str, allowed: Iterable[str] = ()) -> HostPolicy:
        given = [n for n in (host_name(a) if a != ANY_HOST else a for a in allowed) if n]
        names = set(given) - {ANY_HOST}
        bare = bound_host.strip("[]")
        address = _address(bare)
        wildcard = bare in WILDCARD_BINDS or (address is not None and address.is_unspecified)
        if wildcard:
            names.add(socket.gethostname().lower())  # the machine's own name, as LAN clients type it
        elif (bound := host_name(bound_host)) is not None:
            names.add(bound)
        return cls(frozenset(names), any_address=wildcard, open=ANY_HOST in given)

    def allows(self, name: str | None) -> bool:
        if self.open:
            return True
        if name is None:
            return False
        return is_loopback(name) or name in self.names or (self.any_address and _address(name) is not None)


class HostCheck:
    """403 with an OpenAI error object for a request whose Host names a host not answered, or
    a state-changing request whose Origin names one and is not allowed by the CORS rule (the
    rule that answers the preflight, so a request is never refused after its preflight passed)."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, cors: CorsRule) -> None:
        self.app = app
        self.policy = policy
        self.cors = cors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.refusal(scope)
            if error is not None:
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ApiError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host")
        # No Host at all is no browser's request (HTTP/1.0 tools): nothing to rebind.
        if host is not None and not self.policy.allows(host_name(host)):
            return _refused(f"Host {host!r}", "reach it as localhost or 127.0.0.1")
        origin = headers.get("origin")
        if origin is None or scope.get("method") not in STATE_CHANGING or self.cors.allows(origin):
            return None
        if origin != "null" and self.policy.allows(host_name(urlsplit(origin).netloc)):
            return None
        if origin == "null":  # any sandboxed frame or file:// page sends it: allowing it would allow them all
            return ApiError(
                403,
                "Origin 'null' (a sandboxed frame or a file:// page) is refused: any page can send it; serve "
                "the web app from an http(s) origin and start `localspec serve` with --cors-origin THAT_ORIGIN",
                code="host_not_allowed",
            )
        return _refused(f"Origin {origin!r}", f"allow a web app with --cors-origin {origin}")


def _refused(what: str, fix: str) -> ApiError:
    return ApiError(
        403,
        f"{what} is not a name this server answers to (a web page could reach a local server through "
        f"a domain it points here: DNS rebinding); {fix}, or start `localspec serve` with --allow-host NAME",
        code="host_not_allowed",
    )
