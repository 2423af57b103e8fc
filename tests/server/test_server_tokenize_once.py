"""The server tokenizes each prompt once (issue 31): in the request's thread when the model
is loaded, else in the generation thread, never both. A live server on the reference model,
whose tokenizer counts its calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localspec.api import Runtime, load
from localspec.core.sampling import SamplingConfig
from localspec.server import Catalog, LocalServer, Settings
from localspec.server.request_prompts import stream_kwargs
from localspec.server.worker import Item, Job, Worker

httpx = pytest.importorskip("httpx")

MODEL = "ref"
CHAT = [{"role": "user", "content": "Name three rivers."}]
BOUND_SECONDS = 60  # a bound, not a timing


class Counted:
    """A runtime whose target counts tokenize calls."""

    def __init__(self) -> None:
        self.runtime = load("reference:seed=0", backend="reference", calibrate=False)
        self.calls = 0
        real = self.runtime.target.tokenize

        def counted(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
            self.calls += 1
            return real(text, add_special=add_special, parse_special=parse_special)

        self.runtime.target.tokenize = counted  # type: ignore[method-assign]

    def calls_of(self, **prompt: Any) -> int:
        """The tokenize calls one tokenization of this prompt makes."""
        before = self.calls
        self.runtime.prepare(**prompt)
        return self.calls - before


@pytest.fixture(scope="module")
def counted() -> Counted:
    return Counted()


@pytest.fixture(scope="module")
def server(counted: Counted) -> Iterator[LocalServer]:
    def loader(model_id: str) -> Runtime:
        return counted.runtime

    settings = Settings(log=lambda line: None)
    catalog = Catalog(MODEL, pairs=False)
    with LocalServer(counted.runtime, MODEL, loader, port=0, catalog=catalog, settings=settings) as srv:
        srv.start()
        yield srv


@pytest.mark.parametrize(
    ("path", "body", "prompt"),
    [
        ("/chat/completions", {"messages": CHAT}, {"messages": CHAT}),
        ("/completions", {"prompt": "Once upon a time"}, {"prompt": "Once upon a time"}),
    ],
)
def test_a_request_is_tokenized_once(
    server: LocalServer, counted: Counted, path: str, body: dict[str, Any], prompt: dict[str, Any]
) -> None:
    once = counted.calls_of(**prompt)
    before = counted.calls
    reply = httpx.post(
        f"{server.url}{path}", json={"model": MODEL, "max_tokens": 4, "temperature": 0, **body}, timeout=BOUND_SECONDS
    )

    assert reply.status_code == 200, reply.text
    assert once > 0 and counted.calls - before == once


def test_a_job_nobody_tokenized_is_tokenized_once_by_the_generation_thread(counted: Counted) -> None:
    once = counted.calls_of(messages=CHAT)
    worker = Worker(counted.runtime, MODEL, lambda _: counted.runtime, max_queue=4)
    items: list[Item] = []
    try:
        before = counted.calls
        request = stream_kwargs(messages=CHAT, max_tokens=4, stop=(), sampling=SamplingConfig(temperature=0))
        job = Job(MODEL, request, items.append)
        worker.submit(job)
        assert job.finished.wait(BOUND_SECONDS)
    finally:
        worker.stop()

    assert job.outcome == "finished", items
    assert counted.calls - before == once


def test_a_prompt_too_long_for_the_context_is_refused_with_the_servers_hint(server: LocalServer) -> None:
    n_ctx = server.worker.runtime.target.info.n_ctx if server.worker.runtime is not None else 0
    reply = httpx.post(
        f"{server.url}/completions",
        json={"model": MODEL, "prompt": "x" * (n_ctx + 10), "max_tokens": 2},
        timeout=BOUND_SECONDS,
    )

    assert reply.status_code == 400 and "--ctx" in reply.text
