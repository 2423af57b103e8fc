"""`localspec serve` is as lenient as its peers where leniency changes nothing: bodies are JSON
whatever their Content-Type, fields that do not change the text are ignored, a tool-calling
history is accepted, errors are one line naming the right field, and a cut character is
dropped. A live server with the embedded default model, the official `openai` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_support import MODEL, serving

from localspec.common.textstream import TextAssembler
from localspec.server import LocalServer

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.model

RIVERS = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    with serving(smollm2_q4_1) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LocalServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def greedy(client: openai.OpenAI, messages: list[dict[str, object]], **extra: object) -> str:
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, **extra)
    return str(answer.choices[0].message.content)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_body_is_read_as_json_whatever_its_content_type(server, client, content_type) -> None:
    body = b'{"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 8, "temperature": 0}'
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{server.url}/chat/completions", content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == greedy(client, RIVERS)


def test_a_body_that_is_not_json_gets_a_400_that_says_to_send_json(server) -> None:
    response = httpx.post(f"{server.url}/chat/completions", data={"messages": "hi"}, timeout=30)
    assert response.status_code == 400
    assert "send a JSON object" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "extra",
    [
        {"stream_options": {"include_usage": True, "include_obfuscation": False}, "stream": True},
        {"reasoning_effort": "low"},
        {"verbosity": "low", "prediction": {"type": "content", "content": "the Nile"}, "modalities": ["text"]},
    ],
    ids=["include-obfuscation", "reasoning-effort", "verbosity-prediction-modalities"],
)
def test_fields_that_do_not_change_the_text_are_accepted_and_change_nothing(client, extra) -> None:
    plain = greedy(client, RIVERS)
    if extra.get("stream"):
        chunks = client.chat.completions.create(model=MODEL, messages=RIVERS, max_tokens=8, temperature=0, **extra)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = greedy(client, RIVERS, extra_body=extra)
    assert text == plain


def test_an_assistant_turn_with_tool_calls_and_no_content_and_the_tool_result_are_accepted(client) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "rivers", "arguments": '{"n": 3}'}}
    history = [
        *RIVERS,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Nile, Amazon, Danube"},
    ]
    assert isinstance(greedy(client, history), str)


def test_a_message_without_content_or_tool_calls_is_still_refused_by_name(server) -> None:
    body = {"messages": [{"role": "assistant", "content": None}]}
    response = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content"


@pytest.mark.parametrize(
    ("route", "body", "param"), [("chat/completions", "messages", "messages"), ("completions", "prompt", "prompt")]
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_one_line_naming_the_field_of_its_route(
    server, route, body, param, stream
) -> None:
    long = "hi " * 3000
    prompt = [{"role": "user", "content": long}] if body == "messages" else long
    response = httpx.post(f"{server.url}/{route}", json={body: prompt, "stream": stream}, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "context_length_exceeded"
    assert "\n" not in error["message"] and "->" not in error["message"]
    assert "--ctx" in error["message"]  # the fix is still there, in the same sentence


def test_a_max_tokens_cut_inside_a_character_drops_the_partial_character(client) -> None:
    # SmolLM2 writes 日 as two tokens; the first of them alone is two of its three bytes.
    cut = client.completions.create(model=MODEL, prompt="日本語日本語日本語", max_tokens=1, temperature=0)
    assert cut.choices[0].finish_reason == "length"
    assert "\ufffd" not in cut.choices[0].text
    whole = client.completions.create(model=MODEL, prompt="日本語日本語日本語", max_tokens=2, temperature=0)
    assert whole.choices[0].text.startswith("日")


def test_the_text_assembler_drops_a_cut_character_at_the_end_but_keeps_held_stop_text() -> None:
    text = TextAssembler(lambda t: bytes([t]), stops=("STOP",))
    assert text.push(list(b"ok ST")) == "ok "
    assert text.push(list("日".encode())[:2]) == ""
    assert text.flush() == "ST"
    assert text.text == "ok ST"
