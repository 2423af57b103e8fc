"""`localspec serve`'s /metrics (Prometheus' text format, read back with prometheus_client's
own parser), what /health says with and without the key, the key's headers, the cap on `n`,
and tokens per step counted by pass (issue 57). A live server on 127.0.0.1 with the reference
model and an API key; tokens per step on the embedded SmolLM2."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from model_support import TEST_N_CTX
from prometheus_client.parser import text_string_to_metric_families

from localspec.api import Runtime, load
from localspec.server import Catalog, LocalServer, Settings
from localspec.server.request_prompts import stream_kwargs
from localspec.server.worker import Job

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "ref", "messages": [{"role": "user", "content": "Count: 1, 2, 3,"}], "max_tokens": 24}


@pytest.fixture
def server() -> Iterator[LocalServer]:
    """A fresh server for each test, so its counters start at zero."""

    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(api_key=KEY, log=lambda line: None)
    with LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings) as s:
        s.start()
        yield s


def root(server: LocalServer) -> str:
    return server.url.removesuffix("/v1")


def scrape(server: LocalServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics by its name and labels, as a Prometheus server reads them."""
    response = httpx.get(f"{root(server)}/metrics", headers=AUTH, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def ref(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset({"model": "ref", **labels}.items())


def chat(server: LocalServer, **extra: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/chat/completions", json={**CHAT, **extra}, headers=AUTH, timeout=60)


def test_metrics_add_up_what_the_answers_said(server: LocalServer) -> None:
    answers = [chat(server, seed=seed, temperature=0.8).json() for seed in (1, 2)]
    samples = scrape(server)
    spec = [answer["speculation"] for answer in answers]
    assert samples[ref("localspec:requests_total", outcome="finished")] == 2
    assert samples[ref("llamacpp:tokens_predicted_total")] == sum(a["usage"]["completion_tokens"] for a in answers)
    assert samples[ref("llamacpp:prompt_tokens_total")] + samples[ref("llamacpp:prompt_tokens_cached_total")] == sum(
        a["usage"]["prompt_tokens"] for a in answers
    )
    assert samples[ref("llamacpp:spec_decode_num_draft_tokens_total")] == sum(s["drafted_tokens"] for s in spec)
    assert samples[ref("llamacpp:spec_decode_num_accepted_tokens_total")] == sum(s["accepted_tokens"] for s in spec)
    assert samples[ref("localspec:verify_passes_total")] == sum(s["verify_steps"] for s in spec)
    assert 0 < samples[ref("llamacpp:spec_decode_num_drafts_total")] <= samples[ref("localspec:verify_passes_total")]
    assert samples[ref("localspec:queue_seconds_count")] == 2
    assert samples[ref("llamacpp:requests_processing")] == samples[ref("llamacpp:requests_deferred")] == 0


def test_metrics_show_the_queue_while_a_request_waits(server: LocalServer) -> None:
    gate = threading.Event()
    held = Job("ref", stream_kwargs(prompt="1, 2, 3,", max_tokens=2, stop=(), sampling={}), lambda _: gate.wait())
    server.worker.submit(held)
    assert server.worker.wait_until(lambda s: s["busy"], timeout=30)
    waiting = threading.Thread(target=chat, args=(server,))
    waiting.start()
    try:
        assert server.worker.wait_until(lambda s: s["waiting"] == 1, timeout=30)
        samples = scrape(server)
        assert samples[ref("llamacpp:requests_processing")] == 1
        assert samples[ref("llamacpp:requests_deferred")] == 1
    finally:
        gate.set()
        waiting.join(60)
    samples = scrape(server)
    assert samples[ref("localspec:queue_seconds_count")] == 2
    assert samples[ref("localspec:queue_seconds_sum")] > 0  # the second request waited for the first
    assert samples[ref("llamacpp:requests_deferred")] == 0


def test_metrics_need_the_key(server: LocalServer) -> None:
    assert httpx.get(f"{root(server)}/metrics", timeout=30).status_code == 401
    assert httpx.get(f"{root(server)}/metrics", headers={"x-api-key": KEY}, timeout=30).status_code == 200


def test_health_without_the_key_says_only_whether_the_server_lives(server: LocalServer) -> None:
    bare = httpx.get(f"{root(server)}/health", timeout=30)
    wrong = httpx.get(f"{root(server)}/health", headers={"Authorization": "Bearer nope"}, timeout=30)
    keyed = httpx.get(f"{root(server)}/health", headers=AUTH, timeout=30)
    assert bare.status_code == wrong.status_code == keyed.status_code == 200
    assert bare.json() == wrong.json() == {"status": "ok"}
    assert keyed.json()["model"] == "ref" and "waiting" in keyed.json()


def test_the_key_is_accepted_as_x_api_key(server: LocalServer) -> None:
    answered = httpx.get(f"{server.url}/models", headers={"x-api-key": KEY}, timeout=30)
    refused = httpx.get(f"{server.url}/models", headers={"x-api-key": "nope"}, timeout=30)
    assert answered.status_code == 200 and answered.json()["data"][0]["id"] == "ref"
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_n_is_capped_at_4_as_in_llama_server(server: LocalServer) -> None:
    assert len(chat(server, n=4, max_tokens=2).json()["choices"]) == 4
    refused = chat(server, n=16, max_tokens=2)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"


def test_plain_decoding_reads_one_token_per_step_even_when_it_ends_at_an_end_of_text(smollm2_q4_1: Path) -> None:
    # The pass that produces the end of text is a step whose token the answer does not show.
    def loader(model_id: str) -> Runtime:
        return load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False, strategy="none", memory=False)

    settings = Settings(log=lambda line: None)
    with LocalServer(loader("plain"), "plain", loader, port=0, settings=settings) as srv:
        srv.start()
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 200, "temperature": 0}
        answer = httpx.post(f"{srv.url}/chat/completions", json=body, timeout=120).json()
    spec = answer["speculation"]
    assert answer["choices"][0]["finish_reason"] == "stop" and spec["drafted_tokens"] == 0
    assert spec["verify_steps"] == answer["usage"]["completion_tokens"] + 1
    assert spec["tokens_per_step"] == 1.0
