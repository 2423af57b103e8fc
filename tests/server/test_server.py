"""`localspec serve` as clients see it: a live server on 127.0.0.1 (port 0) with the embedded
default model, driven by the official `openai` client and by raw HTTP."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from model_support import TEST_N_CTX
from server_support import serve_process

from localspec.api import Runtime, load, runtime_for
from localspec.core.protocol import Backend, VocabIdentity
from localspec.server import Catalog, LocalServer, Settings, local_only
from localspec.server.fim import FimTokens, find_fim_tokens
from localspec.server.request_prompts import stream_kwargs
from localspec.server.worker import Job, Worker

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
RIVERS = [{"role": "user", "content": "Name three rivers."}]
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    def loader(model_id: str) -> Runtime:
        return load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False)

    settings = Settings(keepalive_s=0.05, max_body_bytes=BODY_LIMIT, log=lambda line: None)
    with LocalServer(loader(MODEL), MODEL, loader, port=0, max_queue=16, settings=settings) as srv:
        srv.start()
        yield srv


@pytest.fixture(scope="module")
def client(server: LocalServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def python_api(target_backend: Backend) -> Runtime:
    return runtime_for(target_backend, calibrate=False)


@pytest.fixture
def held(server: LocalServer) -> Iterator[threading.Event]:
    """The generation thread held on a request of its own until the event is set, so that
    what queues behind it is known."""
    gate = threading.Event()
    idle_count(server.worker)
    job = Job(MODEL, stream_kwargs(prompt="1, 2, 3,", max_tokens=2, stop=(), sampling={}), lambda _: gate.wait())
    server.worker.submit(job)
    assert server.worker.wait_until(lambda s: s["busy"], timeout=30)
    yield gate
    gate.set()
    assert server.worker.wait_until(lambda s: not s["busy"] and not s["waiting"], timeout=60)


def chat(client: openai.OpenAI, messages: list[dict[str, str]], n: int, **extra: Any) -> openai.types.ChatCompletion:
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, **{"temperature": 0, **extra})


# -- the openai client ------------------------------------------------------------------------


def test_chat_completion_at_temperature_0_equals_the_python_api_and_localspec_run(
    client, python_api, smollm2_q4_1, capsys
) -> None:
    from localspec.cli.main import main

    answer = chat(client, RIVERS, 24)
    expected = python_api.generate(messages=RIVERS, max_tokens=24, temperature=0)
    assert answer.object == "chat.completion" and answer.model == MODEL
    assert answer.choices[0].message.content == expected.text
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason == {"stop": "stop", "max_tokens": "length"}[expected.finish_reason]
    assert answer.usage.completion_tokens == expected.stats.generated_tokens
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    spec = answer.model_extra["speculation"]
    assert spec["strategy"] == "ngram" and spec["verify_steps"] >= 1
    assert set(spec) >= {
        "drafted_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "tokens_per_step",
        "mean_draft_length",
        "decode_tokens_per_s",
        "prompt_seconds",
        "decode_seconds",
    }
    assert spec["prompt_seconds"] > 0 and spec["decode_seconds"] > 0
    assert spec["bit_exact"] is True  # greedy on Q4_1 within 256 tokens: plain decoding's by construction

    capsys.readouterr()
    args = ["run", "Name three rivers.", "-t", "0", "-n", "24", "--model", str(smollm2_q4_1), "--ctx", str(TEST_N_CTX)]
    args += ["--draft-tokens", "4"]  # a fixed draft length needs no calibration; greedy text is the same
    assert main(args) == 0
    assert capsys.readouterr().out == expected.text + "\n"


def test_streamed_chat_gives_the_same_text_in_chunks(client) -> None:
    whole = chat(client, RIVERS, 24).choices[0].message.content
    chunks = list(chat(client, RIVERS, 24, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "speculation" in chunks[-1].model_extra


def test_include_usage_sends_a_last_chunk_with_usage_and_no_choices(client) -> None:
    usage = chat(client, RIVERS, 16).usage
    chunks = list(chat(client, RIVERS, 16, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == usage
    assert all(c.usage is None for c in chunks[:-1])


def test_text_completion_continues_the_prompt_as_the_python_api_does(client, python_api) -> None:
    answer = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    expected = python_api.generate(prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == expected.text
    assert answer.choices[0].finish_reason == "length"
    streamed = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected.text


def test_stop_strings_end_the_answer_before_them(client) -> None:
    full = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert " 7" in full.choices[0].text
    for stop in (" 7", [" 9", " 7"]):
        cut = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=stop)
        assert cut.choices[0].text == full.choices[0].text.split(" 7")[0]
        assert cut.choices[0].finish_reason == "stop"


def test_models_lists_the_loaded_pair(client) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == MODEL
    assert client.models.retrieve(MODEL).id == MODEL


def test_asking_for_a_pair_that_is_not_pulled_names_localspec_pull(client) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="smollm2-1.7b", messages=RIVERS, max_tokens=4)
    assert "localspec pull smollm2-1.7b" in caught.value.message


# -- raw HTTP -----------------------------------------------------------------------------------


def test_sse_framing_is_data_events_keep_alive_comments_and_done(server, held) -> None:
    """A request waiting behind another gets keep-alive comments until its first event."""
    lines: list[str] = []
    body = {"model": MODEL, "messages": RIVERS, "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            lines.append(line)
            if line == ": keep-alive":
                held.set()
    events = [line for line in lines if line.startswith("data: ")]
    assert ": keep-alive" in lines
    assert all(line in ("", ": keep-alive") or line.startswith("data: ") for line in lines)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def idle_count(worker: Worker) -> int:
    """Requests served so far, once the previous one has left the generation thread (its
    answer is sent a moment before), so that the next request to run is the test's own."""
    assert worker.wait_until(lambda s: not s["busy"] and not s["waiting"], timeout=60)
    return int(worker.status()["served"])


def test_a_client_that_leaves_mid_stream_ends_its_generation_within_one_step(server, client) -> None:
    worker = server.worker
    served = idle_count(worker)
    body = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # the generation is running: leave
    assert worker.wait_until(lambda s: s["served"] > served and not s["busy"], timeout=60)
    job = worker.history[-1]
    assert job.outcome == "cancelled"
    assert job.steps_at_cancel is not None and job.steps - job.steps_at_cancel <= 1
    assert job.steps < 1000
    assert chat(client, RIVERS, 4).choices[0].message.content


def test_a_non_streaming_client_that_leaves_ends_its_generation(server, client) -> None:
    worker = server.worker
    served = idle_count(worker)
    body = json.dumps({"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 1000, "temperature": 0}).encode()
    host, port = server.address
    with socket.create_connection((host, port)) as sock:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert worker.wait_until(lambda s: s["busy"], timeout=30)
    assert worker.wait_until(lambda s: s["served"] > served and not s["busy"], timeout=60)
    job = worker.history[-1]
    assert job.outcome == "cancelled" and job.steps < 1000
    assert chat(client, RIVERS, 4).choices[0].message.content


def test_eight_clients_at_once_each_get_their_sequential_answer(server, client) -> None:
    prompts = [f"Count from {i} to {i + 5}." for i in range(8)]
    sequential = {p: chat(client, [{"role": "user", "content": p}], 4).choices[0].message.content for p in prompts}

    def one_client(i: int) -> list[tuple[str, str]]:
        mine = [prompts[(i + k) % len(prompts)] for k in range(2)]  # two each: all eight queue at once
        return [(p, chat(client, [{"role": "user", "content": p}], 4).choices[0].message.content) for p in mine]

    with ThreadPoolExecutor(8) as pool:
        answers = [a for client_answers in pool.map(one_client, range(8)) for a in client_answers]
    assert len(answers) == 16
    assert all(text == sequential[p] for p, text in answers)
    assert httpx.get(server.url.removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_requests_beyond_the_queue_limit_get_503_with_retry_after(server, held) -> None:
    limit = server.worker.max_queue
    server.worker.max_queue = 0
    try:
        response = httpx.post(f"{server.url}/chat/completions", json={"model": MODEL, "messages": RIVERS}, timeout=30)
    finally:
        server.worker.max_queue = limit
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "queue_full"


@pytest.mark.parametrize(
    ("content", "body", "status", "param"),
    [
        ("raw", b'{"messages": [', 400, None),
        ("json", {"messages": "hello"}, 400, "messages"),
        ("json", {"messages": RIVERS, "temperature": "hot"}, 400, "temperature"),
        ("json", {"messages": RIVERS, "top_p": 0}, 400, "top_p"),
        ("json", {"messages": RIVERS, "model": "smollm2-1.7b"}, 404, "model"),  # known, not pulled
        ("json", {"messages": []}, 400, "messages"),
        ("json", {"messages": RIVERS, "n": 17}, 400, "n"),
        ("json", {"messages": RIVERS, "tools": [{"type": "function"}]}, 400, "tools[0]"),
        ("json", {"messages": RIVERS, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        ("json", {"messages": RIVERS, "response_format": {"type": "xml"}}, 400, "response_format"),
        ("json", {"messages": RIVERS, "frobnicate": 1}, 400, "frobnicate"),
        ("json", {"messages": [{"role": "user", "content": "hi " * 3000}]}, 400, "messages"),
        ("raw", b'{"messages": "' + b"x" * (BODY_LIMIT + 1) + b'"}', 413, None),
    ],
    ids=[
        "malformed",
        "wrong-type",
        "bad-temperature",
        "top-p-out-of-range",
        "model-not-pulled",
        "empty",
        "n-over-16",
        "tools",
        "logprobs",
        "response-format",
        "unknown-field",
        "over-context",
        "over-body-limit",
    ],
)
def test_bad_input_gets_an_openai_error_and_the_server_stays_up(server, content, body, status, param) -> None:
    url = f"{server.url}/chat/completions"
    if content == "raw":
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert "Traceback" not in response.text
    assert httpx.get(server.url.removesuffix("/v1") + "/health").status_code == 200


def test_a_prompt_over_the_context_is_refused_before_a_stream_starts(server) -> None:
    body = {"messages": [{"role": "user", "content": "hi " * 3000}], "stream": True}
    response = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_suffix_on_a_model_without_fim_tokens_is_a_400_that_says_so(server) -> None:
    body = {"prompt": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 4}
    response = httpx.post(f"{server.url}/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "fill-in-the-middle" in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "suffix"


def test_a_cors_preflight_from_an_origin_not_allowed_is_refused(server) -> None:
    headers = {"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"}
    response = httpx.options(f"{server.url}/chat/completions", headers=headers)
    assert response.status_code == 400
    assert "--cors-origin" in response.json()["error"]["message"]
    assert "access-control-allow-origin" not in response.headers


# -- settings -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[LocalServer]:
    """A server with an API key and one allowed origin (the reference model: only the HTTP
    layer is under test)."""

    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(api_key="s3cret", cors_origins=["http://app.example"], log=lambda line: None)
    with LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings) as s:
        s.start()
        yield s


def test_an_api_key_is_required_on_every_route_but_health(keyed_server) -> None:
    url = keyed_server.url
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    missing = httpx.get(f"{url}/models")
    wrong = httpx.get(f"{url}/models", headers={"Authorization": "Bearer nope"})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="nope", max_retries=0).models.list()
    keyed = openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0)
    answer = keyed.chat.completions.create(model="ref", messages=RIVERS, max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens <= 4


def test_an_allowed_origin_passes_the_cors_preflight(keyed_server) -> None:
    headers = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    response = httpx.options(f"{keyed_server.url}/chat/completions", headers=headers)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "http://app.example"


def test_a_request_like_an_earlier_one_is_drafted_from_its_answer(client) -> None:
    # Sampled with a seed: the same text again, drafted from the memory. (A greedy request on
    # llama.cpp's default kernels drafts from its own text only: docs/serve.md.)
    messages = [{"role": "user", "content": "List four farm animals, one per line, each with the sound it makes."}]
    first, again = (chat(client, messages, 48, temperature=0.7, seed=5) for _ in range(2))
    assert again.choices[0].message.content == first.choices[0].message.content
    steps = [answer.model_extra["speculation"]["verify_steps"] for answer in (first, again)]
    assert steps[1] < steps[0] * 0.6  # most of the answer came four tokens a step


def test_serve_no_memory_keeps_requests_apart() -> None:
    from localspec.cli.main import build_parser

    assert build_parser().parse_args(["serve"]).memory is True
    assert build_parser().parse_args(["serve", "--no-memory"]).memory is False


def test_the_default_bind_address_is_127_0_0_1() -> None:
    from localspec.cli.main import build_parser

    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    runtime = load("reference:seed=0", backend="reference", calibrate=False)
    with LocalServer(runtime, "ref", lambda _: runtime, port=0) as server:
        assert server.address[0] == "127.0.0.1"
    assert local_only("127.0.0.1") and not local_only("0.0.0.0")


@pytest.fixture(scope="module")
def fim_model(smollm2_q4_1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with three rare tokens renamed to StarCoder's FIM tokens (same byte
    length, so the GGUF is patched in place): a vocabulary with FIM tokens to serve."""
    data = bytearray(smollm2_q4_1.read_bytes())
    start = data.index(b"tokenizer.ggml.tokens")
    for old, new in (
        (b"orangutans", b"<fim_prefix>"),
        (b"volleyball", b"<fim_suffix>"),
        (b"Identities", b"<fim_middle>"),
    ):
        at = data.index(struct.pack("<Q", 12) + "Ġ".encode() + old, start) + 8
        data[at : at + 12] = new
    path = tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf"
    path.write_bytes(bytes(data))
    return path


def test_suffix_fills_in_the_middle_where_the_vocabulary_has_fim_tokens(fim_model: Path) -> None:
    runtime = load(str(fim_model), n_ctx=TEST_N_CTX, calibrate=False)
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    catalog = Catalog("fim", pairs=False)
    with LocalServer(
        runtime, "fim", lambda _: runtime, port=0, catalog=catalog, settings=Settings(log=lambda line: None)
    ) as srv:
        srv.start()
        body = {"model": "fim", "prompt": prefix, "suffix": suffix, "max_tokens": 8, "temperature": 0}
        answer = httpx.post(f"{srv.url}/completions", json=body, timeout=60).json()
        target = runtime.target
        fim = find_fim_tokens(target.vocab_identity())
        assert fim is not None
        head = target.tokenize("", add_special=True, parse_special=False)
        ids = fim.prompt(
            prefix, suffix, lambda text: target.tokenize(text, add_special=False, parse_special=False), head
        )
        expected = runtime.generate(prompt=ids, max_tokens=8, temperature=0)
    assert answer["choices"][0]["text"] == expected.text
    assert answer["usage"]["prompt_tokens"] == len(ids)


def test_naming_a_pulled_pair_loads_it_in_place_of_the_served_model(
    fim_model: Path, smollm2_q4_1: Path, temporary_localspec_home: Path
) -> None:
    models = temporary_localspec_home / "models"  # the embedded default's pair, as after a pull
    models.mkdir(parents=True)
    (models / smollm2_q4_1.name).symlink_to(smollm2_q4_1)

    def loader(model_id: str) -> Runtime:
        return load(str(fim_model) if model_id == "fim" else model_id, n_ctx=TEST_N_CTX, calibrate=False)

    settings = Settings(log=lambda line: None)
    with LocalServer(loader("fim"), "fim", loader, port=0, catalog=Catalog("fim"), settings=settings) as srv:
        srv.start()
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["fim", MODEL]
        answer = client.chat.completions.create(model="default", messages=RIVERS, max_tokens=4, temperature=0)
        assert answer.model == MODEL and srv.worker.model_id == MODEL
        assert [m.id for m in client.models.list().data] == [MODEL, "fim"]
        again = client.chat.completions.create(model="fim", messages=RIVERS, max_tokens=4, temperature=0)
        assert again.model == "fim" and srv.worker.model_id == "fim"


def test_fim_tokens_are_found_by_their_spelling_and_put_in_prefix_suffix_middle_order() -> None:
    texts = (b"a", b"<fim_prefix>", b"<fim_suffix>", b"<fim_middle>", b"b")
    fim = find_fim_tokens(VocabIdentity("bpe", len(texts), None, None, texts))
    assert fim == FimTokens(1, 2, 3)
    assert fim.prompt("ab", "b", lambda text: [0 if c == "a" else 4 for c in text], [9]) == [9, 1, 0, 4, 2, 4, 3]
    assert find_fim_tokens(VocabIdentity("bpe", 2, None, None, (b"a", b"b"))) is None


def test_sigterm_stops_the_server_cleanly_with_a_stream_in_flight() -> None:
    import signal

    with serve_process("reference:seed=0", "--backend", "reference") as (process, url):
        body = {"prompt": "once", "max_tokens": 100000, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    process.send_signal(signal.SIGTERM)
                    break
        assert process.wait(60) == 0
        assert process.stderr is not None and "localspec serve: stopped" in process.stderr.read()
