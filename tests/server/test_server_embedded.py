"""LocalServer inside an app, over the app's own runtime: stop() leaves that runtime to the app
(open, answering), and the server writes nothing on the app's stdout or stderr; its request
lines go to the logger "localspec.server"."""

from __future__ import annotations

import logging

import httpx
import pytest

from localspec.api import Runtime, load
from localspec.server import Catalog, LocalServer


def app_runtime() -> Runtime:
    return load("reference:seed=0", backend="reference", calibrate=False)


def ask(server: LocalServer) -> str:
    body = {"model": "ref", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    answer = httpx.post(f"{server.url}/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def test_stop_leaves_the_apps_runtime_open_and_answering() -> None:
    with app_runtime() as runtime:
        server = LocalServer(runtime, "ref", lambda _: runtime, port=0, catalog=Catalog("ref", pairs=False))
        server.start()
        served = ask(server)
        server.stop()

        after = runtime.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)

    assert after.text == served


def test_a_runtime_the_server_loaded_itself_is_closed_at_stop() -> None:
    loaded: list[Runtime] = []

    def loader(model_id: str) -> Runtime:
        loaded.append(app_runtime())
        return loaded[-1]

    server = LocalServer(None, "ref", loader, port=0, catalog=Catalog("ref", pairs=False))
    server.start()
    assert server.wait_ready(60)
    ask(server)
    server.stop()

    with pytest.raises(Exception, match="closed"):
        loaded[0].generate("hi", max_tokens=1)


def test_request_lines_go_to_logging_not_to_the_apps_streams(capfd, caplog) -> None:
    catalog = Catalog("ref", pairs=False)
    with (
        app_runtime() as runtime,
        caplog.at_level(logging.INFO, logger="localspec.server"),
        LocalServer(runtime, "ref", lambda _: runtime, port=0, catalog=catalog) as server,
    ):
        server.start()
        ask(server)

    assert capfd.readouterr() == ("", "")
    lines = [r.getMessage() for r in caplog.records if r.name == "localspec.server"]
    assert any(line.startswith("POST /v1/chat/completions 200") for line in lines), lines
