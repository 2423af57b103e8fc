"""`localspec serve` listens before its model is loaded, as a launcher expects: a busy port is
said at once, GET /health answers 503 "loading" until the model is there, requests sent
meanwhile wait and are answered, and a model that cannot be loaded is said to every waiting
client and stops the server with the load's own message."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_support import serve_process

from localspec.api import Runtime, load
from localspec.cli.main import main
from localspec.core.errors import ModelLoadError
from localspec.server import Catalog, LocalServer, Settings

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

CHAT = [{"role": "user", "content": "Name three rivers."}]


def reference() -> Runtime:
    return load("reference:seed=0", backend="reference", calibrate=False)


def health(server: LocalServer) -> httpx.Response:
    return httpx.get(server.url.removesuffix("/v1") + "/health", timeout=10)


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def gated() -> Iterator[tuple[threading.Event, list[BaseException]]]:
    """A load that waits for the test's go, then loads the reference model or raises what
    the test put in the list."""
    go = threading.Event()
    failures: list[BaseException] = []
    yield go, failures
    go.set()


def gated_server(go: threading.Event, failures: list[BaseException]) -> LocalServer:
    def loader(model_id: str) -> Runtime:
        assert go.wait(60)
        if failures:
            raise failures[0]
        return reference()

    settings = Settings(log=lambda line: None)
    return LocalServer(None, "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings)


def test_requests_sent_while_the_model_loads_wait_for_it_and_are_answered(gated) -> None:
    go, _ = gated
    with gated_server(go, []) as server:
        server.start()
        loading = health(server)
        assert loading.status_code == 503 and loading.json()["status"] == "loading"
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        with ThreadPoolExecutor(2) as pool:
            asked = [
                pool.submit(client.chat.completions.create, model="ref", messages=CHAT, max_tokens=4, temperature=0),
                pool.submit(client.completions.create, model="ref", prompt="once", max_tokens=4, stream=True),
            ]
            wait_for(lambda: health(server).json()["waiting"] == 2)
            assert not server.wait_ready(0.05)
            go.set()
            assert server.wait_ready(30)
            answer = asked[0].result(60)
            streamed = "".join(chunk.choices[0].text for chunk in asked[1].result(60))
        assert answer.choices[0].message.content and answer.usage.completion_tokens <= 4
        assert streamed
        ready = health(server)
        assert ready.status_code == 200 and ready.json()["status"] == "ok"


def test_a_model_that_cannot_be_loaded_is_said_to_waiting_clients_and_stops_the_server(gated) -> None:
    go, failures = gated
    failures.append(ModelLoadError("model.gguf is truncated", "download it again"))
    with gated_server(go, failures) as server:
        server.start()
        with ThreadPoolExecutor(1) as pool:
            body = {"messages": CHAT, "max_tokens": 4}
            waiting = pool.submit(httpx.post, f"{server.url}/chat/completions", json=body, timeout=60)
            wait_for(lambda: health(server).json()["waiting"] == 1)
            go.set()
            with pytest.raises(ModelLoadError, match="truncated"):
                server.wait_ready(30)
            refused = waiting.result(60)
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "model_not_loaded" and "model.gguf is truncated" in error["message"]
        assert server._thread is not None
        server._thread.join(30)
        assert not server._thread.is_alive()  # stopped: nothing to serve


def test_serve_says_a_busy_port_before_it_loads_anything(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.server.worker import Worker

    # Patched on the class, not localspec.api.load: a module imported meanwhile would keep the fake.
    loads: list[object] = []
    monkeypatch.setattr(Worker, "_first_load", lambda self: loads.append(self) or False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "reference:seed=0", "--backend", "reference", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    assert not loads


def test_serve_says_a_missing_file_before_it_takes_the_port(tmp_path: Path, capsys) -> None:
    assert main(["serve", "--model", str(tmp_path / "absent.gguf"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "no model file at" in err and "listening" not in err


def test_serve_with_a_file_it_cannot_load_exits_with_the_loads_message(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"plain text, not a model")
    assert main(["serve", "--model", str(bad), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "listening at http://127.0.0.1:" in err
    assert "is not a GGUF file" in err and "convert" in err  # the load's message and what to do
    assert "Traceback" not in err


def test_a_launcher_polls_health_until_the_served_model_is_ready() -> None:
    with serve_process("reference:seed=0", "--backend", "reference") as (process, url):
        statuses = []
        deadline = time.monotonic() + 60
        while not statuses or statuses[-1] != 200:
            assert time.monotonic() < deadline, f"never ready: {statuses}"
            statuses.append(httpx.get(url.removesuffix("/v1") + "/health", timeout=10).status_code)
            time.sleep(0.02)
        assert set(statuses) <= {200, 503}
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        answer = client.chat.completions.create(model="reference:seed=0", messages=CHAT, max_tokens=4, temperature=0)
        assert answer.usage.completion_tokens <= 4
        process.terminate()
        assert process.wait(60) == 0
        assert process.stderr is not None and "is ready" in process.stderr.read()
