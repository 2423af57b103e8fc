"""Tools through each model's own chat template: a template that reads `tools` describes the
functions and writes earlier calls itself; calls come back in OpenAI's shape from Hermes'
<tool_call>, Llama 3's JSON and Gemma 4's `call:NAME{...}` formats; a forced call is written in
the format the template prompts for, by grammar, with arguments valid for the schema. Tiny
random GGUFs carry templates in each family's style (the real ones' markers and call syntax)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localspec.api import Runtime, load
from localspec.common.templates import render_chat
from localspec.common.tool_parsing import parse_tool_calls
from localspec.common.tools import GEMMA4, HERMES, LLAMA3, ToolRequest, tool_style
from localspec.server import LocalServer, Settings
from localspec.testing.gguf_writer import CHATML, Spec

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

# Llama 3.1's way: the functions and the answer format in the last user turn, calls as bare
# JSON with "parameters", results under the ipython role.
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ 'ipython' if m['role'] == 'tool' else m['role'] }}"
    "<|end_header_id|>\n\n"
    "{% if loop.last and tools %}Given the following functions, respond with a JSON for a function call. "
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n\n{% endif %}"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}'
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Gemma 4's way: declarations in a developer turn, calls as <|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>.
GEMMA4_TEMPLATE = (
    "{% if tools %}<start_of_turn>developer\n{% for t in tools %}<|tool>declaration:{{ t.function.name }}"
    "{{ t.function.parameters | tojson }}<tool|>{% endfor %}<end_of_turn>\n{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{% if m.get('tool_calls') %}"
    "{% for c in m['tool_calls'] %}<|tool_call>call:{{ c.function.name }}{{ '{' }}"
    '{% for k, v in c.function.arguments.items() %}{{ k }}:<|"|>{{ v }}<|"|>{% if not loop.last %},{% endif %}'
    "{% endfor %}{{ '}' }}<tool_call|>{% endfor %}{% else %}{{ m['content'] }}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Qwen2.5's way: a system block listing the tools, <tool_call> blocks, <tool_response> results.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>"
    '\nReturn <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{% endif %}'
    "{% for m in messages %}<|im_start|>{{ 'user' if m['role'] == 'tool' else m['role'] }}\n"
    "{% if m['role'] == 'tool' %}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% elif m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {
    "name": "get_weather",
    "description": "The weather now in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["city", "unit", "days"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"]},
}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
]


def test_each_template_gets_its_own_style_and_one_without_tools_the_hermes_block() -> None:
    assert tool_style(CHATML) == tool_style(None) == tool_style("{{ messages }}")
    assert not tool_style(CHATML).native and tool_style(CHATML).format == HERMES
    assert (tool_style(LLAMA3_TEMPLATE).format, tool_style(LLAMA3_TEMPLATE).native) == (LLAMA3, True)
    assert (tool_style(GEMMA4_TEMPLATE).format, tool_style(GEMMA4_TEMPLATE).native) == (GEMMA4, True)
    assert (tool_style(HERMES_TEMPLATE).format, tool_style(HERMES_TEMPLATE).native) == (HERMES, True)


@pytest.mark.parametrize(
    ("template", "call"),
    [
        (LLAMA3_TEMPLATE, '{"name": "get_time", "parameters": {"zone": "CET"}}'),
        (GEMMA4_TEMPLATE, '<|tool_call>call:get_time{zone:<|"|>CET<|"|>}<tool_call|>'),
        (HERMES_TEMPLATE, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'),
    ],
    ids=["llama3", "gemma4", "hermes"],
)
def test_the_template_renders_the_tools_and_an_earlier_call_in_its_own_format(template: str, call: str) -> None:
    tools = ToolRequest((WEATHER, TIME), forced=False)
    text = render_chat(template, tools.native_messages(HISTORY), {}, tools=tools.tools())
    assert call in text and "get_weather" in text and "12:00" in text
    content, calls = parse_tool_calls(call, tools.names)
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_time", {"zone": "CET"})
    ]


def test_llama3_calls_are_read_with_or_without_the_python_tag_and_only_for_offered_functions() -> None:
    names = {"get_time", "get_weather"}
    two = '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", "arguments": {"city": "A"}}'
    assert [c["function"]["name"] for c in parse_tool_calls(two, names)[1]] == ["get_time", "get_weather"]
    answer = '{"name": "Ada", "parameters": {"age": 3}}'  # JSON that names no function is an answer
    assert parse_tool_calls(answer, names) == (answer, [])
    assert parse_tool_calls('{"name": "get_time", "parameters": {}} and more', names)[1] == []


def test_gemma4_calls_keep_types_and_nesting_and_broken_ones_stay_text() -> None:
    text = 'Checking.<|tool_call>call:get_weather{city:<|"|>São, "Paulo"<|"|>,days:3,ok:true,xs:[1,2.5],o:{a:null}}'
    content, (call,) = parse_tool_calls(text + "<tool_call|>")
    assert content == "Checking."
    assert json.loads(call["function"]["arguments"]) == {
        "city": 'São, "Paulo"',
        "days": 3,
        "ok": True,
        "xs": [1, 2.5],
        "o": {"a": None},
    }
    broken = '<|tool_call>call:get_weather{city:<|"|>Oslo}<tool_call|>'
    assert parse_tool_calls(broken) == (broken, [])


@pytest.fixture(scope="module")
def serve_with(models: Callable[[object], Path]) -> Iterator[Callable[[str], openai.OpenAI]]:
    """A server on a tiny model carrying the given chat template, one at a time."""
    servers: list[LocalServer] = []

    def start(template: str) -> openai.OpenAI:
        path = models(Spec("llama", seed=3, chat_template=template, n_ctx=2048))

        def loader(model_id: str) -> Runtime:
            return load(str(path), n_ctx=2048, calibrate=False, strategy="ngram")

        while servers:
            servers.pop().stop()
        srv = LocalServer(loader("tiny"), "tiny", loader, port=0, settings=Settings(log=lambda line: None))
        srv.start()
        servers.append(srv)
        return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)

    yield start
    while servers:
        servers.pop().stop()


@pytest.mark.parametrize(
    "template",
    [LLAMA3_TEMPLATE, GEMMA4_TEMPLATE, HERMES_TEMPLATE, CHATML],
    ids=["llama3", "gemma4", "hermes", "no-tools-template"],
)
def test_a_forced_call_is_written_in_the_templates_format_and_fits_the_schema(serve_with, template: str) -> None:
    client = serve_with(template)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, messages in (("required", ASK), (named, HISTORY)):
        answer = client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=120, temperature=0
        )
        (call,) = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls"
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
        if choice == named:
            assert call.function.name == "get_weather"
