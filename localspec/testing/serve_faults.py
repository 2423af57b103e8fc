"""Hostile schemas and tool definitions against a live `localspec serve` (issue 47): each case
a request and what must come back, a 400 naming the field or an answer that never claims a
"stop" its grammar did not reach, with the server still up after it. Shared by
tests/server/test_server_lenient.py (every case, for CI) and benchmarks/fault_injection.py (the
"schemas" and "tools" rows, with the slow pattern case besides)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from localspec.api import Runtime, load
from localspec.server import Catalog, LocalServer, Settings

CHAT = {"model": "ref", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 48, "temperature": 0}


@dataclass(frozen=True)
class Case:
    """A request's extra fields and what must come back: a status, and for a 200 a finish
    reason among `finishes` (a forced call must come back as one)."""

    name: str
    extra: dict[str, Any]
    status: int
    param: str | None = None
    finishes: tuple[str, ...] = ()

    def check(self, url: str) -> str | None:
        """Why the answer is wrong (None: it is right), the server's health included."""
        try:
            response = httpx.post(f"{url}/chat/completions", json={**CHAT, **self.extra}, timeout=300)
        except httpx.HTTPError as exc:
            return f"no answer: {exc}"
        if response.status_code != self.status:
            return f"status {response.status_code}, expected {self.status}: {response.text[:200]}"
        body = response.json()
        if self.status != 200:
            error = body.get("error", {})
            if not error.get("message") or error.get("param") != self.param:
                return f"error {error} should name {self.param!r}"
        elif (finish := body["choices"][0]["finish_reason"]) not in self.finishes:
            return f"finish_reason {finish!r}, expected one of {self.finishes}"
        elif finish == "tool_calls":
            call = body["choices"][0]["message"]["tool_calls"][0]["function"]
            json.loads(call["arguments"])
        if httpx.get(url.removesuffix("/v1") + "/health", timeout=30).status_code != 200:
            return "the server is not healthy after it"
        return None


def json_schema(schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def tools(parameters: Any, choice: Any = "required") -> dict[str, Any]:
    # Room for a whole call in the reference model's byte tokens.
    function = {"name": "f", "parameters": parameters}
    return {"tools": [{"type": "function", "function": function}], "tool_choice": choice, "max_tokens": 160}


NESTED = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/$defs/B"}},
    "$defs": {"A": {"enum": ["x", "y"]}, "B": {"type": "object", "properties": {"c": {"$ref": "#/$defs/A"}}}},
    "required": ["a", "b"],
}
NEVER_STOP = ("length", "grammar_error")

SCHEMA_CASES = [
    Case("a $ref to the root only", json_schema({"$ref": "#"}), 400, "response_format"),
    Case(
        "a $ref to itself in $defs",
        json_schema({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}),
        400,
        "response_format",
    ),
    Case("an unknown type", json_schema({"type": "no-such-type"}), 400, "response_format"),
    Case("a schema that is a string", json_schema("notaschema"), 400, "response_format"),
    Case(
        "an object that must contain itself",
        json_schema({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
        200,
        finishes=NEVER_STOP,
    ),
    Case("nested $defs", json_schema(NESTED), 200, finishes=("stop", "length")),
]
# About 5 s of grammar work per mask on 2 cores: the benchmark's row only.
SLOW_SCHEMA_CASES = [
    Case(
        "a pattern of a million characters",
        json_schema({"type": "string", "pattern": "^(a{1000}){1000}$"}),
        200,
        finishes=NEVER_STOP,
    ),
]
TOOL_CASES = [
    Case("parameters that are a string, offered", tools("notaschema", "auto"), 400, "tools[0].function.parameters"),
    Case("parameters that are a list, forced", tools([1, 2]), 400, "tools[0].function.parameters"),
    Case("a call forced without tools", {"tool_choice": "required"}, 400, "tool_choice"),
    Case(
        "a named call without tools",
        {"tool_choice": {"type": "function", "function": {"name": "f"}}},
        400,
        "tool_choice",
    ),
    Case(
        "a call naming no offered function",
        tools({"type": "object"}, {"type": "function", "function": {"name": "g"}}),
        400,
        "tool_choice",
    ),
    Case("a tool without a name", {"tools": [{"type": "function", "function": {}}]}, 400, "tools[0]"),
    Case("a forced call with $defs", tools(NESTED), 200, finishes=("tool_calls",)),
    Case(
        "a named call with $defs",
        tools(NESTED, {"type": "function", "function": {"name": "f"}}),
        200,
        finishes=("tool_calls",),
    ),
    Case("no tools, tool_choice auto", {"tools": [], "tool_choice": "auto"}, 200, finishes=("stop", "length")),
]


@contextmanager
def reference_server() -> Iterator[LocalServer]:
    """A live server on the reference model (fast; llguidance reads its byte vocabulary)."""

    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(log=lambda line: None)
    with LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings) as s:
        s.start()
        yield s
