"""Tools, logprobs, penalties and pydantic schemas through the Python API, as `serve` offers
them and through the same code (common/tools.py, Runtime.tool_prompt/tool_constraint, the
engine's LogprobRecorder), on the real SmolLM2: a forced call comes back as a typed ToolCall
whose arguments validate against the pydantic model offered, a pydantic model as a schema
gives JSON that validates against it (closed to extra keys, so it ends), logprobs equal
serve's, and penalties change the text as serve's do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from server_support import MODEL, serving

import localspec
from localspec.api import Finished, Runtime, TextDelta, runtime_for
from localspec.common.tools import ToolRequestError
from localspec.core.errors import InvalidRequestError
from localspec.core.grammar import json_schema_of
from localspec.core.protocol import Backend
from localspec.server import LocalServer

openai = pytest.importorskip("openai")


class Weather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=30)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population: int = Field(ge=0, le=100_000_000)


ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK_CITY = [{"role": "user", "content": "Describe Paris as JSON."}]
RIVERS = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture
def rt(target_backend: Backend) -> Runtime:
    """The default model as load() runs it (n-gram lookup)."""
    return runtime_for(target_backend, strategy="ngram", calibrate=False)


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    with serving(smollm2_q4_1) as srv:
        yield srv


# -- tools -------------------------------------------------------------------------------------


@pytest.mark.model
def test_a_forced_call_comes_back_as_a_typed_tool_call(rt: Runtime) -> None:
    out = rt.generate(messages=ASK_WEATHER, tools=[Weather], tool_choice=Weather, max_tokens=48, temperature=0)

    assert out.finish_reason == "tool_calls"
    (call,) = out.tool_calls
    assert isinstance(call, localspec.ToolCall) and call.name == "Weather"
    weather = call.parse(Weather)  # the grammar kept the arguments inside the model's schema
    assert isinstance(weather, Weather) and weather.unit in ("celsius", "fahrenheit")
    assert call.args() == weather.model_dump()
    assert "<tool_call>" not in out.text  # the call is not left in the text


@pytest.mark.model
def test_a_streamed_call_shows_no_call_text_and_ends_with_the_call(rt: Runtime) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": Weather.model_json_schema()}}
    with rt.stream(messages=ASK_WEATHER, tools=[tool], tool_choice="required", max_tokens=48, temperature=0) as s:
        events = list(s)

    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert isinstance(done, Finished) and done.finish_reason == "tool_calls"
    assert shown == done.text and "<tool_call>" not in shown
    assert [c.name for c in done.tool_calls] == ["weather"]
    Weather.model_validate(done.tool_calls[0].args())


@pytest.mark.model
def test_the_same_forced_call_in_process_and_through_serve(rt: Runtime, server: LocalServer) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": Weather.model_json_schema()}}
    choice = {"type": "function", "function": {"name": "weather"}}
    # reuse_prefix="exact": the same answer whatever the shared target cached before, as serve gives
    here = rt.generate(
        messages=ASK_WEATHER, tools=[tool], tool_choice=choice, max_tokens=48, temperature=0, reuse_prefix="exact"
    )
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    there = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[tool], tool_choice=choice, max_tokens=48, temperature=0
    )

    served = there.choices[0].message.tool_calls
    assert there.choices[0].finish_reason == here.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in served] == [(c.name, c.arguments) for c in here.tool_calls]


@pytest.mark.model
def test_a_call_goes_back_into_the_chat_for_the_next_turn(rt: Runtime) -> None:
    first = rt.generate(messages=ASK_WEATHER, tools=[Weather], tool_choice="required", max_tokens=48, temperature=0)
    chat: list[dict[str, Any]] = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": first.tool_calls},  # ToolCall values as they came
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "21 C and sunny"},
    ]
    after = rt.generate(messages=chat, tools=[Weather], max_tokens=24, temperature=0)
    assert after.stats.prompt_tokens > first.stats.prompt_tokens and after.finish_reason in ("stop", "max_tokens")


@pytest.mark.model
@pytest.mark.asyncio
async def test_agenerate_takes_tools_and_a_positional_chat(rt: Runtime) -> None:
    out = await rt.agenerate(ASK_WEATHER, tools=[Weather], tool_choice="required", max_tokens=48, temperature=0)
    assert out.finish_reason == "tool_calls"
    out.tool_calls[0].parse(Weather)


BAD_TOOLS: dict[str, tuple[dict[str, Any], str]] = {
    "forced-without-tools": (dict(tool_choice="required"), "tool_choice"),
    "not-a-tool": (dict(tools=[{"name": "f"}]), "tools[0]"),
    "not-a-list": (dict(tools=Weather), "tools"),
    "choice-not-offered": (dict(tools=[Weather], tool_choice=City), "tool_choice"),
}


@pytest.mark.model
@pytest.mark.parametrize("case", BAD_TOOLS)
def test_tools_that_cannot_be_used_are_refused_naming_the_argument(rt: Runtime, case: str) -> None:
    given, param = BAD_TOOLS[case]
    with pytest.raises(ToolRequestError) as caught:
        rt.generate(messages=ASK_WEATHER, max_tokens=4, **given)
    assert caught.value.param == param


@pytest.mark.model
def test_tools_need_a_chat_and_one_constraint(rt: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="messages="):
        rt.generate("weather?", tools=[Weather], max_tokens=4)
    with pytest.raises(InvalidRequestError, match="give one"):
        rt.generate(messages=ASK_WEATHER, tools=[Weather], tool_choice="required", json_schema=City, max_tokens=4)


# -- pydantic schemas ----------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("how", ["json_schema", "response_format"])
def test_a_pydantic_model_as_the_schema_gives_json_that_validates_against_it(rt: Runtime, how: str) -> None:
    schema: dict[str, Any] = {how: City}
    out = rt.generate(messages=ASK_CITY, max_tokens=80, temperature=0, **schema)

    assert out.finish_reason == "stop"  # it ended: no extra keys to add until max_tokens
    City.model_validate_json(out.text)
    assert set(json.loads(out.text)) <= set(City.model_fields)


def test_schemas_are_strict_unless_they_say_otherwise() -> None:
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        name: str

    assert json_schema_of(City)["additionalProperties"] is False  # type: ignore[index]
    assert json_schema_of(Open)["additionalProperties"] is True  # type: ignore[index]
    loose = {"type": "json_schema", "json_schema": {"schema": City.model_json_schema(), "strict": False}}
    assert "additionalProperties" not in json_schema_of(loose)  # type: ignore[operator]


# -- logprobs and penalties ----------------------------------------------------------------------


@pytest.mark.model
def test_logprobs_are_servings(rt: Runtime, server: LocalServer) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    served = client.chat.completions.create(
        model=MODEL, messages=RIVERS, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3
    )
    here = rt.generate(
        messages=RIVERS, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3, reuse_prefix="exact"
    )

    content = served.choices[0].logprobs.content
    assert here.logprobs is not None and len(here.logprobs) == len(here.tokens) == len(content)
    assert [e.text.decode() for e in here.logprobs] == [t.token for t in content]
    assert [e.logprob for e in here.logprobs] == pytest.approx([t.logprob for t in content], abs=1e-4)
    assert [[lp for _, _, lp in e.top] for e in here.logprobs] == [
        pytest.approx([a.logprob for a in t.top_logprobs], abs=1e-4) for t in content
    ]


@pytest.mark.model
def test_each_delta_carries_its_tokens_logprobs(rt: Runtime) -> None:
    with rt.stream(messages=RIVERS, max_tokens=12, temperature=0, top_logprobs=2) as events:
        deltas = [e for e in events if isinstance(e, TextDelta)]
    assert all(len(d.logprobs) == len(d.tokens) for d in deltas)
    assert all(e.top[0][2] >= e.logprob and len(e.top) == 2 for d in deltas for e in d.logprobs)  # greedy: the best
    assert rt.generate(messages=RIVERS, max_tokens=4, temperature=0).logprobs is None  # not asked: none


@pytest.mark.model
@pytest.mark.parametrize(
    "penalty",
    [{"frequency_penalty": 1.5}, {"presence_penalty": 2.0, "frequency_penalty": 0.5}, {"repeat_penalty": 1.6}],
)
def test_penalties_as_keywords_change_the_text_as_servings_do(
    rt: Runtime, server: LocalServer, penalty: dict[str, Any]
) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    served = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4, 5, 6,", max_tokens=24, temperature=0, extra_body=penalty
    )
    plain = rt.generate("1, 2, 3, 4, 5, 6,", max_tokens=24, temperature=0)
    here = rt.generate("1, 2, 3, 4, 5, 6,", max_tokens=24, temperature=0, reuse_prefix="exact", **penalty)

    assert here.text != plain.text
    assert here.text == served.choices[0].text


@pytest.mark.model
def test_a_bad_top_logprobs_or_penalty_is_refused(rt: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="top_logprobs"):
        rt.generate("x", max_tokens=2, top_logprobs=21)
    with pytest.raises(InvalidRequestError, match="frequency_penalty"):
        rt.generate("x", max_tokens=2, frequency_penalty=9)
