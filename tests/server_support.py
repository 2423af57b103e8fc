"""The embedded model behind a real `localspec serve` for the server tests, and plain decoding
that evaluates every prompt as a fresh request would (what a served answer must equal)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from model_support import TEST_N_CTX

from localspec import Finished
from localspec.api import Runtime, load
from localspec.pool import Pool
from localspec.server import LocalServer, Settings

MODEL = "smollm2-135m"
# Short prompts the tiny written models answer in lanes (test_batching_recurrent.py, test_batching_heads.py).
LANE_ASKS = [
    "one two three one two three one two",
    "the cat sat on the mat and the cat",
    "red green blue red green blue red",
    "a b c d a b c d a b",
    "hello world hello world hello",
    "north south east west north south",
]


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


def close_and_cancel_mid_answer(
    pool: Pool,
    messages: list[dict[str, str]],
    read: int,
    ready: Callable[[], bool] = lambda: True,
    beside: Callable[[], None] | None = None,
) -> dict[str, str]:
    """Two lanes stopped mid-answer (their answers asked far longer than the stop): lane 0's
    stream closed from this thread while another thread reads it (after `read` events), and
    lane 1's asyncio answer cancelled once it decodes beside the others and ready() says so;
    beside runs in a thread of its own from the first stop's reading on. The outcomes: lane 0's
    finish reason ("closed") and whether lane 1's task ended "cancelled" or "finished" ("task")."""
    stream = pool.runtimes[0].stream(messages=messages, max_tokens=400, temperature=0)
    reading, got = threading.Event(), {}

    def reader() -> None:
        for n, event in enumerate(stream):
            if n == read:
                reading.set()
            if isinstance(event, Finished):
                got["closed"] = event.finish_reason

    async def cancelled() -> str:
        task = asyncio.ensure_future(pool.runtimes[1].agenerate(messages=messages, max_tokens=400, temperature=0))
        lane = pool.runtimes[1].target
        for _ in range(12000):  # it decodes beside the others before it is cancelled
            if lane.n_past > 0 and ready():
                break
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "finished"

    threads = [threading.Thread(target=reader), *([threading.Thread(target=beside)] if beside else [])]
    threads[0].start()
    assert reading.wait(120)
    for thread in threads[1:]:
        thread.start()
    got["task"] = asyncio.run(cancelled())
    stream.close()  # from this thread, while the reader iterates it
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    return got


def asked_at_once(pool: Pool, asks: list[tuple[str, dict[str, Any]]], max_tokens: int = 32) -> list[Any]:
    """Each (prompt, knobs) ask's Completion, asked by as many threads at once as the pool has
    lanes, each thread taking every lanes-th ask in turn."""
    out: list[Any] = [None] * len(asks)
    lanes = len(pool.runtimes)

    def client(k: int) -> None:
        for i in range(k, len(asks), lanes):
            prompt, knobs = asks[i]
            out[i] = pool.generate(messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, **knobs)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert all(result is not None for result in out)
    return out
