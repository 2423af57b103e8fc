"""Tools on `localspec serve` through the official `openai` client: the functions are described
to the model, a <tool_call> block in the answer comes back as OpenAI's tool_calls with finish
reason "tool_calls", tool_choice "required" or a named function forces a well-formed call by
grammar (even from the 135M default model), "none" answers in text, and a tool-calling history
is read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_support import TEST_N_CTX
from pydantic import BaseModel

from localspec.api import Runtime, load
from localspec.common.tool_parsing import parse_tool_calls
from localspec.common.tools import ToolRequest
from localspec.server import LocalServer, Settings

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class WeatherArguments(BaseModel):
    city: str
    unit: str


@pytest.fixture(scope="module")
def client(smollm2_q4_1: Path) -> Iterator[openai.OpenAI]:
    def loader(model_id: str) -> Runtime:
        return load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False)

    with LocalServer(loader(MODEL), MODEL, loader, port=0, settings=Settings(log=lambda line: None)) as srv:
        srv.start()
        yield openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, tool_choice: object, **extra: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=tool_choice, max_tokens=80, temperature=0, **extra
    )


def test_tool_choice_required_forces_a_well_formed_call(client) -> None:
    answer = ask(client, "required")
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_a_named_function_is_the_one_called_with_arguments_that_fit_its_schema(client) -> None:
    answer = ask(client, {"type": "function", "function": {"name": "get_weather"}})
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    arguments = WeatherArguments.model_validate_json(call.function.arguments)
    assert arguments.unit in ("celsius", "fahrenheit")


def test_a_streamed_call_arrives_as_a_tool_calls_delta(client) -> None:
    chunks = list(ask(client, "required", stream=True))
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(calls) == 1 and json.loads(calls[0][0].function.arguments) is not None
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_answers_in_text(client) -> None:
    answer = ask(client, "none")
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_tool_choice_auto_answers_text_or_calls_and_never_leaves_a_call_in_the_text(client) -> None:
    message = ask(client, "auto").choices[0].message
    assert message.tool_calls or "<tool_call>" not in (message.content or "")


def test_a_history_with_a_call_and_its_result_is_answered(client) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=24, temperature=0
    )
    assert answer.choices[0].message.content


def test_calls_are_parsed_out_of_the_text_and_broken_blocks_stay_text() -> None:
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    unterminated = '<tool_call>{"name": "get_time", "arguments": {}}'
    assert parse_tool_calls(unterminated)[1][0]["function"]["name"] == "get_time"


def test_the_tools_are_described_in_the_system_message_and_history_calls_written_back() -> None:
    tools = ToolRequest((WEATHER["function"],), forced=False)
    call = {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "21"},
    ]
    system, assistant, result = tools.messages(chat)
    assert system["content"].startswith("Be brief.") and '"name": "get_weather"' in system["content"]
    assert assistant["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert result == {"role": "user", "content": "<tool_response>\n21\n</tool_response>"}


def test_a_tool_choice_naming_no_offered_function_is_a_400(client) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, {"type": "function", "function": {"name": "nope"}})
    assert caught.value.body["param"] == "tool_choice"


def test_tools_on_text_completions_are_refused_by_name(client) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"tools": [WEATHER]})
    assert caught.value.body["param"] == "tools"
