"""serve's remote images: an `image_url` part naming an http(s) URL is refused unless the
server was started with --allow-image-urls; then it is fetched here, before the request is
queued, with a size cap, a time limit, a bounded number of redirects and the bytes checked to
be an image. Loopback, private and link-local addresses stay refused (SSRF: a web page could
otherwise make the server read the router, a cloud's metadata service or a local admin page)
unless --allow-private-image-urls says so. Each hop connects to the address that was checked,
not to a second lookup's (DNS rebinding), and no proxy from the environment is used; the
certificate authorities trusted over https are certifi's, or in their place those
SSL_CERT_FILE or SSL_CERT_DIR name."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localspec.common.media import MAX_IMAGE_BYTES
from localspec.server.schemas import ApiError

INLINE = "send the image inline as a data URL (data:image/png;base64,...)"
TRUST = f"{INLINE}, or, for an image server of your own, start serve with SSL_CERT_FILE set to its CA's PEM file"
REDIRECTS = (301, 302, 303, 307, 308)
# The leading bytes of the formats llama.cpp's image decoder (stb_image) reads.
SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


@dataclass(frozen=True)
class ImageUrls:
    """Whether serve fetches images named by http(s) URLs, and within what bounds."""

    allow: bool = False  # --allow-image-urls
    private: bool = False  # --allow-private-image-urls: loopback and private networks too
    max_bytes: int = MAX_IMAGE_BYTES  # the most an image may take, fetched or inline
    timeout_s: float = 10.0  # the whole fetch, redirects included
    max_redirects: int = 3


@dataclass(frozen=True)
class _Part:
    """Where an image part sits in the request, for the error's param."""

    url: str
    param: str


async def fetch_image_urls(messages: list[dict[str, Any]], rule: ImageUrls) -> list[dict[str, Any]]:
    """The chat with each http(s) image_url part replaced by the fetched bytes (named by the
    URL in later errors); a 400 naming the part and the fix for a URL that is refused or fails."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            url = _remote_url(part)
            if url is not None:
                where = _Part(url, f"messages[{i}].content[{j}].image_url.url")
                part = {"type": "image", "data": await _fetch(where, rule), "path": url}
            parts.append(part)
        out.append({**message, "content": parts})
    return out


def _remote_url(part: Any) -> str | None:
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    return url if isinstance(url, str) and url.lower().startswith(("http://", "https://")) else None


async def _fetch(part: _Part, rule: ImageUrls) -> bytes:
    if not rule.allow:
        raise ApiError(
            400,
            "image URLs are not fetched: a request could make this server reach any address it can, your "
            f"network's too. {INLINE[0].upper()}{INLINE[1:]}, or start serve with --allow-image-urls",
            param=part.param,
        )
    try:
        return await asyncio.wait_for(_follow(part, rule), rule.timeout_s)
    except asyncio.TimeoutError:
        raise _refused(part, f"the image at {part.url} did not arrive within {rule.timeout_s:g} s", INLINE) from None


async def _follow(part: _Part, rule: ImageUrls) -> bytes:
    """GET the URL, following at most rule.max_redirects redirects, each hop checked."""
    import httpx  # only a server that fetches images needs it

    url = httpx.URL(part.url)
    options: dict[str, Any] = {"follow_redirects": False, "timeout": rule.timeout_s}
    async with httpx.AsyncClient(trust_env=False, verify=_authorities(), **options) as client:
        for _ in range(rule.max_redirects + 1):
            if url.scheme not in ("http", "https") or not url.host:
                raise _refused(part, f"the image URL redirected to {url}, which is not an http(s) URL", INLINE)
            answer = await _get(part, client, url, await _checked_addresses(part, url, rule), rule)
            if isinstance(answer, bytes):
                return answer
            url = answer
    raise _refused(part, f"the image URL redirected more than {rule.max_redirects} times", "give the image's own URL")


def _authorities() -> ssl.SSLContext:
    """certifi's certificate authorities, or in their place those SSL_CERT_FILE or SSL_CERT_DIR
    name (a company's own CA), as httpx reads them when it trusts the environment: the client
    does not (trust_env=False), since that would take proxies from the environment too."""
    import httpx

    return httpx.create_ssl_context(trust_env=True)


async def _get(part: _Part, client: Any, url: Any, addresses: Sequence[str], rule: ImageUrls) -> Any:
    """The image's bytes, or the URL a redirect names: from the first of the checked addresses
    that takes the connection (a name may resolve to IPv6 and IPv4 addresses alike)."""
    import httpx

    for k, address in enumerate(addresses):
        pinned, options = _pinned(url, address)
        try:
            async with client.stream("GET", pinned, **options) as reply:
                if reply.status_code in REDIRECTS and "location" in reply.headers:
                    return url.join(reply.headers["location"])
                return await _body(part, reply, rule)
        except httpx.ConnectError as exc:
            untrusted = _certificate_refusal(exc)
            if untrusted is not None:
                raise _refused(part, f"cannot verify the certificate of {url.host}: {untrusted}", TRUST) from None
            if k + 1 == len(addresses):
                raise _refused(part, f"cannot connect to {url.host}: {exc or 'refused'}", INLINE) from None
        except httpx.HTTPError as exc:
            raise _refused(part, f"cannot fetch the image at {url}: {exc or type(exc).__name__}", INLINE) from None
    raise AssertionError("getaddrinfo gave no address")


def _certificate_refusal(exc: BaseException) -> str | None:
    """Why the server's certificate was not trusted, where that is what failed the connection
    (httpx's ConnectError wraps httpcore's, which wraps the ssl module's error)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return str(cause.verify_message or cause.reason or cause)
        cause = cause.__cause__ or cause.__context__
    return None


def _pinned(url: Any, address: str) -> tuple[Any, dict[str, Any]]:
    """The request to url sent to the address that was checked: the URL's host in the Host
    header and, over TLS, in SNI, so the certificate is still checked against the name."""
    headers = {"Host": url.netloc.decode("ascii"), "Accept": "image/*"}
    extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    return url.copy_with(host=address), {"headers": headers, "extensions": extensions}


async def _checked_addresses(part: _Part, url: Any, rule: ImageUrls) -> list[str]:
    """The addresses to connect to, in the resolver's order; refused where any address the
    name has is not public and the server was not told to reach private ones."""
    host = url.raw_host.decode("ascii")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _refused(part, f"cannot resolve the image URL's host {host}: {exc.strerror or exc}", INLINE) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    private = [a for a in addresses if not is_public(a)]
    if private and not rule.private:
        raise _refused(
            part,
            f"the image URL's host {host} is at {private[0]}, a loopback, private or link-local address, which "
            "serve does not reach for a request",
            f"{INLINE}, or start serve with --allow-private-image-urls if the images are on your own network",
        )
    return addresses


def is_public(address: str) -> bool:
    """Whether an address is on the public internet (not loopback, private, link-local,
    multicast or reserved), an IPv4 address written as IPv6 judged as itself."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _body(part: _Part, reply: Any, rule: ImageUrls) -> bytes:
    """The answer's bytes, at most rule.max_bytes, checked to be an image."""
    if reply.status_code != 200:
        raise _refused(part, f"the image URL answered HTTP {reply.status_code}", f"check the URL, or {INLINE}")
    cap = f"the image at {part.url} is larger than this server's {rule.max_bytes >> 20} MiB for a fetched image"
    declared = reply.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > rule.max_bytes:
        raise _refused(part, cap, "send a smaller image")
    chunks: list[bytes] = []
    size = 0
    async for chunk in reply.aiter_bytes():
        size += len(chunk)
        if size > rule.max_bytes:
            raise _refused(part, cap, "send a smaller image")
        chunks.append(chunk)
    data = b"".join(chunks)
    if image_format(data) is None:
        kind = reply.headers.get("content-type", "no Content-Type")
        raise _refused(part, f"the content at {part.url} is not an image ({kind})", "give a PNG, JPEG, GIF or BMP")
    return data


def image_format(data: bytes, signatures: Sequence[tuple[bytes, str]] = SIGNATURES) -> str | None:
    """The image format data begins with, of those llama.cpp decodes; None for anything else."""
    return next((name for magic, name in signatures if data.startswith(magic)), None)


def _refused(part: _Part, message: str, fix: str) -> ApiError:
    return ApiError(400, f"{message}: {fix}", param=part.param)
