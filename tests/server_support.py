"""The embedded model behind a real `localspec serve` for the server tests, and plain decoding
that evaluates every prompt as a fresh request would (what a served answer must equal)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from model_support import TEST_N_CTX

from localspec.api import Runtime, load
from localspec.server import LocalServer, Settings

MODEL = "smollm2-135m"


@contextmanager
def serving(model: Path) -> Iterator[LocalServer]:
    with serving_runtimes(lambda: load(str(model), n_ctx=TEST_N_CTX, calibrate=False), MODEL) as srv:
        yield srv


@contextmanager
def serving_runtimes(make: Callable[[], Runtime], name: str) -> Iterator[LocalServer]:
    """A started server for `name`, every runtime it loads made by make()."""

    def loader(model_id: str) -> Runtime:
        return make()

    with (
        loader(name) as runtime,  # the server leaves a runtime it is given open
        LocalServer(runtime, name, loader, port=0, settings=Settings(log=lambda line: None)) as srv,
    ):
        srv.start()
        yield srv


@contextmanager
def fresh_plain(model: Path) -> Iterator[Runtime]:
    """Plain decoding; its callers ask for reuse_prefix="exact", as serve does by default."""
    with load(str(model), n_ctx=TEST_N_CTX, calibrate=False, strategy="none", memory=False) as runtime:
        yield runtime


@contextmanager
def serve_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`localspec serve ARGS --port 0` in its own process, as an app launches it, and the URL
    it says it listens at; killed on the way out if it still runs."""
    command = [sys.executable, "-m", "localspec", "serve", *args, "--port", "0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        url = None
        for line in process.stderr:
            found = re.search(r"listening at (http://127\.0\.0\.1:\d+/v1)", line)
            if found:
                url = found.group(1)
                break
        assert url is not None, f"no URL said (exit code {process.poll()})"
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()


def chat_answer(url: str, body: Mapping[str, object]) -> dict[str, Any]:
    """A served chat completion's whole reply, checked to be a 200."""
    response = httpx.post(f"{url}/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer
