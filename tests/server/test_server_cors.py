"""One CORS rule (issue 57): --cors-origin is read as an origin (scheme, host, port; a trailing
slash and the default port ignored), and the same rule answers a browser's preflight and the
request it announces, so a request is never refused after its preflight passed, nor run after
it was refused. Raw HTTP against live servers on 127.0.0.1 (the reference model: only the HTTP
layer is under test)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from localspec.api import Runtime, load
from localspec.core.errors import InvalidRequestError
from localspec.server import Catalog, LocalServer, Settings
from localspec.server.cors import CorsRule, normalize_origin

CHAT = {"model": "ref", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# --cors-origin as given at start, by name.
CONFIGS = {"slash": ["https://app.example/"], "spelt": ["HTTPS://App.Example:443"], "any": ["*"], "none": []}


def start(origins: list[str]) -> LocalServer:
    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(cors_origins=origins, log=lambda line: None)
    server = LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings)
    server.start()
    return server


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, LocalServer]]:
    running = {name: start(origins) for name, origins in CONFIGS.items()}
    yield running
    for server in running.values():
        server.stop()


def send(server: LocalServer, method: str, headers: dict[str, str], body: Any = None) -> http.client.HTTPResponse:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, "/v1/chat/completions", body=data, headers={"Host": f"127.0.0.1:{port}", **headers})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def preflight(server: LocalServer, origin: str) -> http.client.HTTPResponse:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    return send(server, "OPTIONS", headers)


def post(server: LocalServer, origin: str) -> http.client.HTTPResponse:
    return send(server, "POST", {"Origin": origin, "Content-Type": "application/json"}, CHAT)


@pytest.mark.parametrize(
    ("config", "origin", "allowed"),
    [
        ("slash", "https://app.example", True),  # the trailing slash given at start is no part of the origin
        ("slash", "https://app.example:443", True),
        ("slash", "http://app.example", False),  # another scheme is another origin
        ("slash", "https://app.example:8443", False),  # another port too
        ("slash", "https://evil.example", False),
        ("spelt", "https://app.example", True),  # case and the default port as spelt at start
        ("any", "https://anything.example", True),
        ("any", "http://192.168.1.9:3000", True),
        ("any", "null", True),  # '*' is every origin: the user said so, and was warned
        ("none", "https://app.example", False),
    ],
)
def test_the_preflight_and_the_request_it_announces_get_the_same_answer(
    servers: dict[str, LocalServer], config: str, origin: str, allowed: bool
) -> None:
    server = servers[config]
    checked, sent = preflight(server, origin), post(server, origin)
    assert (checked.status == 200) == allowed
    assert (sent.status == 200) == allowed
    if allowed:  # and the browser may read the answer
        assert sent.getheader("access-control-allow-origin") in (origin, "*")
    else:
        assert checked.status == 400 and sent.status == 403
        assert sent.getheader("access-control-allow-origin") is None


def test_any_origin_is_answered_with_a_wildcard(servers: dict[str, LocalServer]) -> None:
    assert preflight(servers["any"], "https://anything.example").getheader("access-control-allow-origin") == "*"


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("https://app.example/", "https://app.example"),
        ("HTTP://LOCALHOST:80", "http://localhost"),
        ("http://localhost:5173", "http://localhost:5173"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("tauri://localhost", "tauri://localhost"),
    ],
)
def test_an_origin_is_its_scheme_host_and_port(given: str, origin: str) -> None:
    assert normalize_origin(given) == origin


@pytest.mark.parametrize("given", ["https://app.example/chat", "app.example", "https://app.example?x=1", "https://:80"])
def test_a_cors_origin_that_is_no_origin_is_refused_with_the_form_to_give(given: str) -> None:
    with pytest.raises(InvalidRequestError, match="is not an origin") as raised:
        CorsRule.of([given])
    assert "scheme://host[:port]" in str(raised.value.hint)


def test_serve_warns_at_start_when_every_origin_is_allowed() -> None:
    command = [sys.executable, "-m", "localspec", "serve", "reference:seed=0", "--backend", "reference"]
    process = subprocess.Popen([*command, "--cors-origin", "*", "--port", "0"], stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    said = []
    try:
        for line in process.stderr:
            said.append(line)
            if "listening at" in line:
                break
    finally:
        process.kill()
        process.wait()
    warning = next((line for line in said if "--cors-origin '*'" in line), "")
    assert warning.startswith("warning:") and "every web page" in warning
