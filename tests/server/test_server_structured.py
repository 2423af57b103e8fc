"""Structured output on `localspec serve`: `response_format` json_object and json_schema
constrain the target through llguidance while n-gram lookup drafts, and the answer is exactly
constrained plain decoding's. Even the 135M default model returns schema-valid JSON. The
official `openai` client, including its pydantic `parse` helper."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict
from server_support import MODEL, fresh_plain, serving

from localspec.api import Runtime
from localspec.core.sampling import SamplingConfig
from localspec.server import LocalServer
from localspec.server.grammar import Grammars

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.model

ASK = [{"role": "user", "content": "Describe a city as JSON with its name, country and population."}]


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    country: str
    population: int
    size: Literal["small", "medium", "large"]


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": model.__name__, "schema": model.model_json_schema(), "strict": True},
    }


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    with serving(smollm2_q4_1) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LocalServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def plain(smollm2_q4_1: Path) -> Iterator[Runtime]:
    with fresh_plain(smollm2_q4_1) as runtime:
        yield runtime


def test_a_json_schema_answer_is_valid_and_exactly_constrained_plain_decoding(client, plain) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=80, temperature=0, response_format=json_schema(City)
    )
    text = answer.choices[0].message.content
    city = City.model_validate_json(text)
    assert answer.choices[0].finish_reason == "stop" and city.name
    constraint = Grammars(plain.target).constraint(json_schema(City))
    expected = plain.generate(
        messages=ASK, max_tokens=80, sampling=SamplingConfig(temperature=0, constraint=constraint), reuse_prefix="exact"
    )
    assert text == expected.text


def test_the_openai_parse_helper_gets_a_typed_object(client) -> None:
    parsed = client.chat.completions.parse(
        model=MODEL, messages=ASK, max_tokens=80, temperature=0, response_format=City
    )
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_json_object_gives_a_json_object_streamed_too(client) -> None:
    # Under json_object the 135M model's greedy answer to ASK (any keys allowed) loops inside
    # its keys past max_tokens, as constrained plain decoding's does: a prompt that names the
    # keys ends, so the test sees a whole object.
    named_keys = [{"role": "user", "content": "Give a JSON object with the name and country of one city."}]
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=named_keys,
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


def test_sampled_answers_are_schema_valid_too(client) -> None:
    for seed in range(3):
        answer = client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=120, temperature=1.0, seed=seed, response_format=json_schema(City)
        )
        if answer.choices[0].finish_reason == "stop":
            City.model_validate_json(answer.choices[0].message.content)


def test_completions_take_a_response_format_as_well(client) -> None:
    answer = client.completions.create(
        model=MODEL,
        prompt="A city in JSON: ",
        max_tokens=80,
        temperature=0,
        extra_body={"response_format": json_schema(City)},
    )
    City.model_validate_json(answer.choices[0].text)


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "xml"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}},
    ],
    ids=["unknown-type", "bad-schema", "schema-not-an-object"],
)
def test_a_response_format_that_cannot_be_used_is_a_400_naming_it(server, response_format) -> None:
    body = {"messages": ASK, "response_format": response_format, "stream": True}
    response = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format"
