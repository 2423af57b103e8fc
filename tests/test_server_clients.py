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
from pydantic import BaseModel
from server_support import MODEL, serving

from localspec.server import LocalServer

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
instructor = pytest.importorskip("instructor")
langchain_openai = pytest.importorskip("langchain_openai")

pytestmark = pytest.mark.model

ASK = "Extract the person: Ada Lovelace, 36, mathematician from London."


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
