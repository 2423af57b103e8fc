"""serve and remote images: an http(s) image_url is fetched only when the server was started
to (--allow-image-urls), from public addresses only unless --allow-private-image-urls says
so, within a size cap, a time limit and a bounded number of redirects, and checked to be an
image. Real HTTP and HTTPS servers on this machine serve the images (hence the private
permission where a fetch is meant to succeed); the HTTPS ones hold certificates of
certificate authorities made here (trustme), one trusted through SSL_CERT_FILE."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from localspec.api import Runtime, load
from localspec.cli.main import build_parser
from localspec.cli.serve import _image_urls
from localspec.server import LocalServer, Settings
from localspec.server.image_urls import ImageUrls, is_public
from localspec.testing.vision_writer import png_bytes, write_vision_pair

N = 16
CAP = 64 << 10  # bytes: a fetched image above it is refused
PICTURE = png_bytes(24, 20, seed=3)


class Images(ThreadingHTTPServer):
    """Paths it was asked for, and an event the slow path waits on (set at teardown)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.asked: list[str] = []
        self.hosts: list[str] = []  # each request's Host header
        self.release = threading.Event()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def over_tls(self, certificate: trustme.LeafCert) -> Images:
        """The same server answering over TLS with this certificate; the handshake in each
        request's own thread, so a client that refuses the certificate holds up no other."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        certificate.configure_cert(context)
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        return self


class _Handler(BaseHTTPRequestHandler):
    server: Images

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        self.server.hosts.append(str(self.headers.get("Host")))
        if self.path.startswith("/hop/"):
            left = int(self.path.removeprefix("/hop/"))
            self._send(302, b"", location="/cat.png" if left == 0 else f"/hop/{left - 1}")
        elif self.path == "/cat.png":
            self._send(200, PICTURE, "image/png")
        elif self.path == "/page.html":
            self._send(200, b"<!doctype html><title>not a cat</title>", "text/html")
        elif self.path == "/big.png":
            self._send(200, PICTURE + bytes(CAP), "image/png")
        elif self.path == "/big-unsized.png":
            self._send(200, PICTURE + bytes(CAP), "image/png", sized=False)
        elif self.path == "/slow.png":
            self.server.release.wait(30)
            self._send(200, PICTURE, "image/png")
        else:
            self._send(404, b"no such image", "text/plain")

    def _send(self, status: int, body: bytes, kind: str = "", location: str = "", sized: bool = True) -> None:
        self.send_response(status)
        if kind:
            self.send_header("Content-Type", kind)
        if location:
            self.send_header("Location", location)
        if sized:
            self.send_header("Content-Length", str(len(body)))
        else:  # HTTP/1.0: the body ends where the connection does
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


def running(server: Images) -> Iterator[Images]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def images() -> Iterator[Images]:
    yield from running(Images())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_vision_pair(tmp_path_factory.mktemp("vision"))


def fresh(pair: tuple[Path, Path], strategy: str = "ngram") -> Runtime:
    return load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1)


def serving(pair: tuple[Path, Path], rule: ImageUrls) -> Iterator[LocalServer]:
    settings = Settings(log=lambda _: None, image_urls=rule)
    with fresh(pair) as runtime, LocalServer(runtime, "vision", lambda _: runtime, port=0, settings=settings) as srv:
        srv.start()
        yield srv


@pytest.fixture(scope="module")
def fetching(pair: tuple[Path, Path]) -> Iterator[LocalServer]:
    """A server that fetches image URLs from any address, this machine's included."""
    yield from serving(pair, ImageUrls(allow=True, private=True, max_bytes=CAP, timeout_s=1.5, max_redirects=2))


@pytest.fixture(scope="module")
def public_only(pair: tuple[Path, Path]) -> Iterator[LocalServer]:
    yield from serving(pair, ImageUrls(allow=True))


def chat(url: str) -> list[dict[str, Any]]:
    part = {"type": "image_url", "image_url": {"url": url}}
    return [{"role": "user", "content": [part, {"type": "text", "text": "What is in the picture?"}]}]


def ask(server: LocalServer, url: str) -> httpx.Response:
    body = {"model": "vision", "messages": chat(url), "max_tokens": N, "temperature": 0}
    return httpx.post(f"{server.url}/chat/completions", json=body, timeout=60)


def refusal(reply: httpx.Response) -> str:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages[0].content[0].image_url.url"
    return str(error["message"])


# -- fetched: the answer is the one for the same image sent inline ---------------------------------


def test_an_allowed_image_url_answers_as_the_same_image_sent_inline(
    pair: tuple[Path, Path], fetching: LocalServer, images: Images
) -> None:
    reply = ask(fetching, f"{images.base}/cat.png")
    assert reply.status_code == 200, reply.text
    inline = "data:image/png;base64," + base64.b64encode(PICTURE).decode()
    with fresh(pair, "none") as plain:
        expected = plain.generate(messages=chat(inline), max_tokens=N, temperature=0).text
    assert reply.json()["choices"][0]["message"]["content"] == expected


def test_the_fetch_connects_to_the_checked_address_and_names_the_urls_host(
    fetching: LocalServer, images: Images
) -> None:
    # The connection goes to the address the name resolved to when checked (DNS rebinding),
    # and the request still says which host it is for (virtual hosts, TLS names).
    url = f"http://localhost:{images.server_address[1]}/cat.png"
    assert ask(fetching, url).status_code == 200
    assert images.hosts[-1] == f"localhost:{images.server_address[1]}"


def test_redirects_are_followed_up_to_the_limit(fetching: LocalServer, images: Images) -> None:
    assert ask(fetching, f"{images.base}/hop/1").status_code == 200  # two redirects: the limit


def test_more_redirects_than_the_limit_are_refused(fetching: LocalServer, images: Images) -> None:
    assert "redirected more than 2 times" in refusal(ask(fetching, f"{images.base}/hop/2"))


# -- refused: each with what to do ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/big.png", "/big-unsized.png"])
def test_an_image_over_the_size_cap_is_refused(fetching: LocalServer, images: Images, path: str) -> None:
    message = refusal(ask(fetching, images.base + path))
    assert "larger than" in message and "send a smaller image" in message


def test_a_page_that_is_not_an_image_is_refused(fetching: LocalServer, images: Images) -> None:
    message = refusal(ask(fetching, f"{images.base}/page.html"))
    assert "not an image (text/html)" in message and "PNG, JPEG" in message


def test_a_missing_image_is_refused_with_its_status(fetching: LocalServer, images: Images) -> None:
    assert "answered HTTP 404" in refusal(ask(fetching, f"{images.base}/nothing.png"))


def test_an_image_that_does_not_arrive_in_time_is_refused(fetching: LocalServer, images: Images) -> None:
    assert "did not arrive within 1.5 s" in refusal(ask(fetching, f"{images.base}/slow.png"))


def test_a_host_that_takes_no_connection_is_refused(fetching: LocalServer) -> None:
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert "cannot connect to localhost" in refusal(ask(fetching, f"http://localhost:{port}/cat.png"))


def test_a_host_that_does_not_resolve_is_refused(fetching: LocalServer) -> None:
    assert "cannot resolve" in refusal(ask(fetching, "http://no-such-host.invalid/cat.png"))


def test_image_urls_are_refused_by_default(pair: tuple[Path, Path], images: Images) -> None:
    before = len(images.asked)
    for server in serving(pair, ImageUrls()):
        message = refusal(ask(server, f"{images.base}/cat.png"))
    assert "not fetched" in message and "data URL" in message and "--allow-image-urls" in message
    assert len(images.asked) == before  # nothing was fetched


# -- SSRF: this machine and private networks only when told -----------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
def test_a_loopback_image_url_is_refused_without_the_private_flag(
    public_only: LocalServer, images: Images, host: str
) -> None:
    before = len(images.asked)
    message = refusal(ask(public_only, f"http://{host}:{images.server_address[1]}/cat.png"))
    assert "loopback, private or link-local" in message and "--allow-private-image-urls" in message
    assert len(images.asked) == before  # refused before connecting


def test_the_cloud_metadata_address_is_refused_without_the_private_flag(public_only: LocalServer) -> None:
    # The cloud metadata address, written as a literal: no lookup, no connection, refused.
    assert "169.254.169.254" in refusal(ask(public_only, "http://169.254.169.254/latest/meta-data/"))


@pytest.mark.parametrize(
    "address, public",
    [
        ("93.184.215.14", True),
        ("2606:4700::6810:85e5", True),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("172.16.5.4", False),
        ("100.64.0.1", False),  # carrier-grade NAT
        ("169.254.169.254", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:10.0.0.1", False),
        ("224.0.0.1", False),
    ],
)
def test_only_public_addresses_count_as_public(address: str, public: bool) -> None:
    assert is_public(address) is public


# -- the flags --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, allow, private",
    [
        ([], False, False),
        (["--allow-image-urls"], True, False),
        (["--allow-private-image-urls"], True, True),
        (["--allow-image-urls", "--allow-private-image-urls"], True, True),
    ],
)
def test_serve_fetches_image_urls_only_when_a_flag_says_so(flags: list[str], allow: bool, private: bool) -> None:
    rule = _image_urls(build_parser().parse_args(["serve", *flags]))
    assert (rule.allow, rule.private) == (allow, private)


# -- over TLS: the certificate checked against the URL's name, by the authorities trusted -----------


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    """A certificate authority of this machine's own, trusted where SSL_CERT_FILE names it."""
    return trustme.CA()


@pytest.fixture
def trusting(authority: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve started with SSL_CERT_FILE naming the authority's PEM file."""
    bundle = tmp_path / "authority.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))


@pytest.fixture(scope="module")
def secure(authority: trustme.CA) -> Iterator[Images]:
    """Images over https, with a certificate the authority issued to localhost."""
    yield from running(Images().over_tls(authority.issue_cert("localhost")))


def https(server: Images, path: str = "/cat.png") -> str:
    return f"https://localhost:{server.server_address[1]}{path}"


def test_an_https_image_url_answers_as_the_same_image_sent_inline(
    pair: tuple[Path, Path], fetching: LocalServer, secure: Images, trusting: None
) -> None:
    before = len(secure.asked)
    reply = ask(fetching, https(secure))
    assert reply.status_code == 200, reply.text
    assert secure.asked[before:] == ["/cat.png"]  # fetched over TLS, from the server named
    inline = "data:image/png;base64," + base64.b64encode(PICTURE).decode()
    with fresh(pair, "none") as plain:
        expected = plain.generate(messages=chat(inline), max_tokens=N, temperature=0).text
    assert reply.json()["choices"][0]["message"]["content"] == expected


def test_an_https_image_url_is_fetched_through_its_redirects(
    fetching: LocalServer, secure: Images, trusting: None
) -> None:
    assert ask(fetching, https(secure, "/hop/1")).status_code == 200


def test_an_https_image_url_whose_authority_is_not_trusted_is_refused_saying_how_to_trust_it(
    fetching: LocalServer, secure: Images
) -> None:
    # No SSL_CERT_FILE: certifi's authorities alone, which never issued this certificate.
    before = len(secure.asked)
    message = refusal(ask(fetching, https(secure)))
    assert "cannot verify the certificate of localhost" in message and "local issuer" in message
    assert "SSL_CERT_FILE" in message and "data URL" in message
    assert "Traceback" not in message
    assert len(secure.asked) == before  # no request was sent over the untrusted connection


@pytest.fixture(scope="module")
def misnamed(authority: trustme.CA) -> Iterator[Images]:
    """Images over https with a certificate the trusted authority issued to another name."""
    yield from running(Images().over_tls(authority.issue_cert("images.example")))


def test_a_certificate_issued_to_another_name_is_refused(
    fetching: LocalServer, misnamed: Images, trusting: None
) -> None:
    # The connection goes to the checked address; the certificate is still checked against
    # the URL's name (SNI and hostname both), not against the address.
    message = refusal(ask(fetching, https(misnamed)))
    assert "cannot verify the certificate of localhost" in message and "not valid for 'localhost'" in message
    assert not misnamed.asked
