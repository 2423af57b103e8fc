"""Real clients of `localspec serve` that need structured output and tools: instructor in its
TOOLS, JSON_SCHEMA and JSON modes and LangChain's ChatOpenAI with with_structured_output and
bind_tools, against the embedded SmolLM2-135M; every object they return is checked against its
JSON schema with jsonschema. TOOLS and JSON_SCHEMA are forced by grammar, so even the 135M model
answers validly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from server_support import MODEL, serving

from localspec.server import LocalServer

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
instructor = pytest.importorskip("instructor")
langchain_openai = pytest.importorskip("langchain_openai")

pytestmark = pytest.mark.model

RIVERS = [{"role": "user", "content": "Name three rivers."}]
# The 135M model's greedy answer ends inside max_tokens for this wording under every mode here;
# "Extract the person: Ada Lovelace, 36, mathematician from London." loops inside the name
# under JSON_SCHEMA, as constrained plain decoding does.
ASK = "Extract the person from this text: Ada Lovelace, aged 36, is a mathematician."


class Person(BaseModel):
    name: str
    age: int
    job: Literal["mathematician", "painter", "engineer"]


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    with serving(smollm2_q4_1) as srv:
        yield srv


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_gets_a_valid_object_in_its_forced_modes(server: LocalServer, mode: str) -> None:
    client = instructor.from_openai(
        openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0), mode=getattr(instructor.Mode, mode)
    )
    person = client.chat.completions.create(
        model=MODEL,
        response_model=Person,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=80,
        temperature=0,
        max_retries=0,
    )
    jsonschema.validate(person.model_dump(mode="json"), Person.model_json_schema())


def test_instructor_json_mode_reaches_the_server_as_a_json_object_request(server: LocalServer) -> None:
    # JSON mode asks for any JSON object (the schema is only in the prompt): the answer is JSON
    # by grammar; whether the 135M model fills Person's fields is the model's business.
    client = instructor.from_openai(
        openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0), mode=instructor.Mode.JSON
    )
    raw = client.chat.completions.create(
        model=MODEL,
        response_model=None,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if raw.choices[0].finish_reason == "stop":  # else cut by max_tokens inside a string
        jsonschema.validate(json.loads(raw.choices[0].message.content), {"type": "object"})
    else:
        assert raw.choices[0].finish_reason == "length" and raw.choices[0].message.content.startswith("{")


def chat(server: LocalServer) -> langchain_openai.ChatOpenAI:
    return langchain_openai.ChatOpenAI(
        base_url=server.url, api_key="unused", model=MODEL, temperature=0, max_tokens=80, max_retries=0
    )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server: LocalServer, method: str) -> None:
    person = chat(server).with_structured_output(Person, method=method).invoke(ASK)
    assert isinstance(person, Person)
    jsonschema.validate(person.model_dump(mode="json"), Person.model_json_schema())


def test_langchain_bind_tools_gets_a_call_with_valid_arguments(server: LocalServer) -> None:
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
        """The weather now in a city."""
        return f"21 {unit} in {city}"

    message = chat(server).bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    }
    jsonschema.validate(call["args"], schema)


class City(BaseModel):
    name: str
    country: str


class Trip(BaseModel):
    traveller: Person
    cities: list[City] = Field(max_length=2)


def test_instructor_tools_mode_takes_a_nested_model(server: LocalServer) -> None:
    # pydantic writes a nested model as $defs and $refs: the forced call's grammar must resolve them.
    assert "$defs" in Trip.model_json_schema()
    client = instructor.from_openai(
        openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0), mode=instructor.Mode.TOOLS
    )
    trip = client.chat.completions.create(
        model=MODEL,
        response_model=Trip,
        messages=[{"role": "user", "content": f"{ASK} She travels to Paris, France."}],
        max_tokens=160,
        temperature=0,
        max_retries=0,
    )
    jsonschema.validate(trip.model_dump(mode="json"), Trip.model_json_schema())


STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


def test_a_seed_reproduces_a_sampled_answer_whatever_the_memory_drafted(server: LocalServer) -> None:
    # The memory holds each earlier answer, so the repeats are drafted from it (the first
    # was not): the seed must fix the text all the same.
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)

    def story() -> str:
        answer = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=40, temperature=0.9, seed=42)
        return str(answer.choices[0].message.content)

    first = story()
    client.chat.completions.create(model=MODEL, messages=RIVERS, max_tokens=12, temperature=0.9)
    assert story() == first
    assert story() == first
    other = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=40, temperature=0.9, seed=43)
    assert other.choices[0].message.content != first


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
            },
        },
    }
]
TRIP = [{"role": "user", "content": "I am going to Paris tomorrow. What should I pack, and why?"}]


def test_a_greedy_request_with_tools_repeats_its_answer_after_other_requests(server: LocalServer) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)

    def ask() -> str:
        answer = client.chat.completions.create(
            model=MODEL, messages=TRIP, tools=WEATHER_TOOLS, max_tokens=80, temperature=0
        )
        return json.dumps([answer.choices[0].message.content, str(answer.choices[0].message.tool_calls)])

    answers = []
    for _ in range(2):  # the second time, the memory holds the first answer to draft from
        # Others first, this request's own text among them: the memory would draft from it.
        client.chat.completions.create(model=MODEL, messages=RIVERS, max_tokens=16, temperature=0)
        client.chat.completions.create(model=MODEL, messages=TRIP, tools=WEATHER_TOOLS, max_tokens=40, temperature=0.8)
        answers.append(ask())
    assert len(set(answers)) == 1


def test_streamed_text_with_tools_offered_arrives_token_by_token(server: LocalServer) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=RIVERS, tools=WEATHER_TOOLS, max_tokens=24, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3, pieces  # not one chunk at the end
