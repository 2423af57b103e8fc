"""`localspec serve` answers only to names a web page cannot re-point at it (DNS rebinding,
issue 33): raw HTTP with forged Host and Origin headers against a live server on 127.0.0.1
(the reference model: only the HTTP layer is under test)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from localspec.api import Runtime, load
from localspec.server import Catalog, LocalServer, Settings
from localspec.server.hosts import HostPolicy, host_name

ALLOWED = "models.lan"
APP_ORIGIN = "http://app.example"
CHAT = {"model": "ref", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(allowed_hosts=[ALLOWED], cors_origins=[APP_ORIGIN], log=lambda line: None)
    with LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings) as s:
        s.start()
        yield s


def send(
    server: LocalServer, method: str, path: str, headers: dict[str, str], body: Any = None
) -> tuple[int, dict[str, Any]]:
    """One request with exactly these headers (http.client adds no Host when one is given)."""
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        extra = {"Content-Type": "application/json"} if data is not None else {}
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in {**headers, **extra}.items():
            conn.putheader(name, value)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def port(server: LocalServer) -> int:
    return server.address[1]


def test_a_host_header_naming_another_domain_is_refused_with_403(server: LocalServer) -> None:
    status, body = send(server, "GET", "/v1/models", {"Host": f"evil.example:{port(server)}"})
    assert status == 403
    assert body["error"]["code"] == "host_not_allowed"
    assert "'evil.example:" in body["error"]["message"] and "--allow-host" in body["error"]["message"]


def test_a_completion_through_a_rebound_domain_is_refused(server: LocalServer) -> None:
    status, body = send(server, "POST", "/v1/chat/completions", {"Host": f"evil.example:{port(server)}"}, CHAT)
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    assert server.worker.status()["waiting"] == 0


def test_health_is_refused_through_a_rebound_domain_too(server: LocalServer) -> None:
    assert send(server, "GET", "/health", {"Host": "evil.example"})[0] == 403


@pytest.mark.parametrize(
    "host",
    ["localhost:{port}", "LOCALHOST.:{port}", "127.0.0.1:{port}", "127.4.5.6", "[::1]:{port}", ALLOWED + ":{port}"],
)
def test_loopback_names_and_allowed_hosts_are_answered(server: LocalServer, host: str) -> None:
    status, body = send(server, "GET", "/v1/models", {"Host": host.format(port=port(server))})
    assert status == 200 and body["data"][0]["id"] == "ref"


def test_a_completion_by_an_allowed_name_is_answered(server: LocalServer) -> None:
    status, body = send(server, "POST", "/v1/chat/completions", {"Host": ALLOWED}, CHAT)
    assert status == 200 and body["usage"]["completion_tokens"] <= 2


def test_a_request_without_a_host_header_is_answered(server: LocalServer) -> None:
    host, p = server.address
    conn = http.client.HTTPConnection(host, p, timeout=30)
    conn._http_vsn_str = "HTTP/1.0"  # HTTP/1.0 has no Host; no browser sends such a request
    conn.putrequest("GET", "/health", skip_host=True)
    conn.endheaders()
    assert conn.getresponse().status == 200
    conn.close()


def test_a_post_from_a_foreign_origin_is_refused_even_with_a_loopback_host(server: LocalServer) -> None:
    headers = {"Host": f"127.0.0.1:{port(server)}", "Origin": "http://evil.example"}
    status, body = send(server, "POST", "/v1/chat/completions", headers, CHAT)
    assert status == 403
    assert "Origin 'http://evil.example'" in body["error"]["message"] and "--cors-origin" in body["error"]["message"]


@pytest.mark.parametrize("origin", ["http://localhost:{port}", "http://127.0.0.1:{port}", APP_ORIGIN])
def test_a_post_from_a_loopback_or_cors_origin_is_answered(server: LocalServer, origin: str) -> None:
    headers = {"Host": f"127.0.0.1:{port(server)}", "Origin": origin.format(port=port(server))}
    assert send(server, "POST", "/v1/chat/completions", headers, CHAT)[0] == 200


def test_a_post_from_the_null_origin_is_refused(server: LocalServer) -> None:
    headers = {"Host": f"127.0.0.1:{port(server)}", "Origin": "null"}  # a sandboxed frame or a file:// page
    assert send(server, "POST", "/v1/chat/completions", headers, CHAT)[0] == 403


def test_a_read_from_a_foreign_origin_is_left_to_cors(server: LocalServer) -> None:
    headers = {"Host": f"127.0.0.1:{port(server)}", "Origin": "http://evil.example"}
    assert send(server, "GET", "/v1/models", headers)[0] == 200  # the browser keeps the answer from the page


def test_host_names_are_read_without_port_case_or_trailing_dot() -> None:
    assert host_name("Evil.Example.:8000") == "evil.example"
    assert host_name("[::1]:8000") == "::1"
    assert host_name("[::1") is None
    assert host_name("[::1].evil.example") is None and host_name("[::1]x:80") is None


def test_a_wildcard_bind_answers_ip_addresses_and_the_machine_name_but_not_other_domains() -> None:
    import socket

    policy = HostPolicy.of("0.0.0.0")
    assert policy.allows("192.168.1.5") and policy.allows("fe80::1") and policy.allows(socket.gethostname().lower())
    assert not policy.allows("evil.example")


def test_a_bound_address_and_the_allow_all_switch() -> None:
    assert HostPolicy.of("192.168.1.5").allows("192.168.1.5")
    assert not HostPolicy.of("192.168.1.5").allows("192.168.1.6")
    assert HostPolicy.of("127.0.0.1", ["*"]).allows("anything.example")


def test_allow_host_is_a_repeatable_serve_option() -> None:
    from localspec.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--allow-host", "a.lan", "--allow-host", "b.lan"])
    assert args.allow_host == ["a.lan", "b.lan"]
    assert build_parser().parse_args(["serve"]).allow_host == []
