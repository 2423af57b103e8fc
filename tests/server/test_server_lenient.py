"""What apps written for llama-server, Ollama or the openai SDKs send, and what the server
answers (issues 47 and 48): lenient where an app cannot be told otherwise (model names,
llama.cpp's fields, n > 1, the SDKs' headers), strict where a value is wrong (a forced call
without tools, parameters that are no schema, a schema nothing satisfies), the key checked
before a body is read. A live server on the reference model: only the HTTP layer is under test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from localspec.api import Runtime, load
from localspec.common.tool_parsing import CallFilter
from localspec.common.tools import tool_request
from localspec.core.stats import Stats, Step
from localspec.server import Catalog, LocalServer, Settings, local_only
from localspec.server.responses import speculation
from localspec.testing.serve_faults import SCHEMA_CASES, TOOL_CASES, Case, reference_server

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

KEY = "s3cret-ключ"  # not ASCII: compared as UTF-8 bytes
APP_ORIGIN = "http://app.example"
CHAT = {"model": "ref", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
AUTH = {"Authorization": b"Bearer " + KEY.encode()}
# What the openai JS SDK (v4/v5) sends in a browser before a chat completion (dangerouslyAllowBrowser).
JS_SDK_HEADERS = (
    "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,x-stainless-package-version,"
    "x-stainless-retry-count,x-stainless-runtime,x-stainless-runtime-version,x-stainless-timeout"
)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(api_key=KEY, cors_origins=[APP_ORIGIN], log=lambda line: None)
    with LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings) as s:
        s.start()
        yield s


def post(
    server: LocalServer, body: Any, headers: dict[str, Any] | None = None, raw: bytes | None = None
) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(
        f"{server.url}/chat/completions", content=content, headers=AUTH if headers is None else headers, timeout=60
    )


# -- the key ---------------------------------------------------------------------------------------


def test_the_key_is_checked_before_the_body_is_parsed(server: LocalServer) -> None:
    response = post(server, None, headers={}, raw=b"{not json")
    assert response.status_code == 401
    assert "JSON" not in response.json()["error"]["message"]


def test_a_key_that_is_not_ascii_is_accepted_as_utf8(server: LocalServer) -> None:
    assert post(server, CHAT).status_code == 200
    assert post(server, CHAT, headers={"Authorization": b"Bearer s3cret-"}).status_code == 401


# -- browsers --------------------------------------------------------------------------------------


def test_the_openai_js_sdk_preflight_is_answered_with_its_headers_allowed(server: LocalServer) -> None:
    headers = {
        "Origin": APP_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": JS_SDK_HEADERS,
    }
    response = httpx.options(f"{server.url}/chat/completions", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == APP_ORIGIN
    allowed = {h.strip().lower() for h in response.headers["access-control-allow-headers"].split(",")}
    assert set(JS_SDK_HEADERS.split(",")) <= allowed


def test_the_null_origin_is_refused_without_suggesting_to_allow_it(server: LocalServer) -> None:
    response = post(server, CHAT, headers={**AUTH, "Origin": "null"})
    assert response.status_code == 403
    assert "--cors-origin null" not in response.json()["error"]["message"]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "localhost", "::1", "0:0:0:0:0:0:0:1", "[::1]"])
def test_loopback_hosts_are_local_however_spelt(host: str) -> None:
    assert local_only(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.2", "example.com", "0:0:0:0:0:0:0:0"])
def test_other_hosts_are_not_local(host: str) -> None:
    assert not local_only(host)


# -- leniency --------------------------------------------------------------------------------------


def test_an_unknown_model_name_is_answered_by_the_loaded_model_and_says_so(server: LocalServer) -> None:
    response = post(server, {**CHAT, "model": "gpt-4o-mini"})
    assert response.status_code == 200
    assert response.json()["model"] == "ref"
    assert "gpt-4o-mini" in response.headers["x-localspec-warning"]


def test_llama_cpp_n_predict_is_max_tokens_and_mirostat_is_ignored_with_a_warning(server: LocalServer) -> None:
    body = {**CHAT, "max_tokens": None, "n_predict": 2, "mirostat": 2, "mirostat_tau": 5.0}
    del body["max_tokens"]
    response = post(server, body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 2
    assert "mirostat" in response.headers["x-localspec-warning"]


def test_a_misspelt_field_and_a_wrong_value_are_still_400(server: LocalServer) -> None:
    assert post(server, {**CHAT, "temprature": 0.5}).status_code == 400
    assert post(server, {**CHAT, "temperature": -1}).status_code == 400


def test_n_choices_are_generated_each_with_its_own_seed(server: LocalServer) -> None:
    body = {**CHAT, "n": 3, "temperature": 1.0, "seed": 11, "max_tokens": 8}
    first, again = post(server, body).json(), post(server, body).json()
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in first["choices"]] == [c["message"]["content"] for c in again["choices"]]
    one = post(server, {**body, "n": 1, "seed": 12}).json()
    assert one["choices"][0]["message"]["content"] == first["choices"][1]["message"]["content"]


def test_n_choices_stream_one_after_another_with_their_index(server: LocalServer) -> None:
    body = {**CHAT, "n": 2, "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, headers=AUTH, timeout=60) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finished == [0, 1]
    assert chunks[-1]["usage"]["completion_tokens"] >= 2


# -- tools -----------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_a_forced_call_without_tools_is_a_400(server: LocalServer) -> None:
    response = post(server, {**CHAT, "tool_choice": "required"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tool_choice"


def test_parameters_that_are_no_schema_are_a_400_even_when_not_forced(server: LocalServer) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": "notaschema"}}]
    response = post(server, {**CHAT, "tools": tools, "tool_choice": "auto"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools[0].function.parameters"


def test_a_forced_call_with_defs_and_refs_compiles() -> None:
    # What pydantic writes for a nested model, as instructor and LangChain send it.
    parameters = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"type": "array", "items": {"$ref": "#/$defs/A"}}},
        "$defs": {"A": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}},
        "required": ["a"],
    }
    other = {"name": "g", "parameters": {"$ref": "#/definitions/B", "definitions": {"B": {"type": "object"}}}}
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": parameters}},
        {"type": "function", "function": other},
    ]
    llguidance = pytest.importorskip("llguidance")
    for form in ("hermes", "llama3"):
        grammar = tool_request(tools, "required").grammar(form)  # type: ignore[union-attr]
        llguidance.LLMatcher.grammar_from_lark(grammar)  # raises where a pointer does not resolve


def test_streamed_text_with_tools_offered_holds_back_only_a_possible_opening() -> None:
    calls = CallFilter({"weather"})
    sent = [
        calls.push(piece) for piece in ["Sure", ", let", " me check.", " <", "tool", "_call>", '{"name": "weather", ']
    ]
    assert sent == ["Sure", ", let", " me check.", " ", "", "", ""]
    calls.push('"arguments": {}}</tool_call>')
    content, found = calls.finish()
    assert content is None and found[0]["function"]["name"] == "weather"


def test_a_streamed_answer_that_only_looked_like_a_call_is_sent_whole_at_the_end() -> None:
    calls = CallFilter({"weather"})
    assert calls.push("  ") == ""
    assert calls.push('{"not": "a call"}') == ""  # a bare JSON answer may be a Llama 3 call
    assert calls.finish() == ('  {"not": "a call"}', [])
    plain = CallFilter({"weather"})
    assert plain.push("1 <") == "1 "  # "<" may begin <tool_call>
    assert plain.push(" 2 is true") == "< 2 is true"


# -- schemas ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema", [{"$ref": "#"}, {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}], ids=["root", "defs"]
)
def test_a_schema_that_only_refers_to_itself_is_a_400(server: LocalServer, schema: dict[str, Any]) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    response = post(server, {**CHAT, "response_format": format_})
    assert response.status_code == 400
    assert "cannot be satisfied" in response.json()["error"]["message"]


def test_grammar_forced_tokens_are_counted_apart_from_drafting() -> None:
    stats = Stats(strategy="none")
    stats.record_step(Step(drafted=5, accepted=5, draft_seconds=0, verify_seconds=0, tokens=(1,) * 6, forced=True))
    stats.record_step(Step(drafted=0, accepted=0, draft_seconds=0, verify_seconds=0, tokens=(2,)))
    stats.generated_tokens = 7
    figures = speculation(stats)
    assert (figures["drafted_tokens"], figures["accepted_tokens"], figures["forced_tokens"]) == (0, 0, 5)
    assert figures["acceptance_rate"] == 0


# -- the fault-injection cases (benchmarks/fault_injection.py counts them) --------------------------


@pytest.fixture(scope="module")
def plain_server() -> Iterator[LocalServer]:
    with reference_server() as server:
        yield server


@pytest.mark.parametrize("case", SCHEMA_CASES + TOOL_CASES, ids=lambda case: case.name)
def test_hostile_schemas_and_tools_are_refused_or_never_end_as_stop(plain_server: LocalServer, case: Case) -> None:
    assert case.check(plain_server.url) is None
