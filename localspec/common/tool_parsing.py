"""Reading the calls a model wrote out of its answer, in each family's format (Hermes'
<tool_call>, Llama 3's bare JSON, Gemma 4's call:NAME{...}), whole or as it streams."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from typing import Any

CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.DOTALL)
GEMMA_OPEN, GEMMA_CLOSE, GEMMA_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
GEMMA_CALL = re.compile(r"(?:<\|tool_call>)?call:([A-Za-z_][\w.\-]*)(\{.*?\})(?:<tool_call\|>|(?=call:)|$)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
BARE_KEY = re.compile(r"[A-Za-z_]\w*")


def parse_tool_calls(text: str, names: Collection[str] = ()) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text outside its calls (None when nothing is left) and its calls in
    OpenAI's shape, in whichever family's format they were written; a block that is not a
    call stays text. names: the functions offered, which a bare Llama 3 JSON answer must name."""
    for pattern, parse in ((CALL, _hermes_call), (GEMMA_CALL, _gemma_call)):
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        cursor = 0
        for match in pattern.finditer(text):
            call = parse(match)
            if call is None:
                continue
            kept.append(text[cursor : match.start()])
            cursor = match.end()
            calls.append(call)
        if calls:
            kept.append(text[cursor:])
            rest = "".join(kept).strip()
            return rest or None, calls
    llama = _llama_calls(text, names)
    return (None, llama) if llama else (text, [])


def _hermes_call(match: re.Match[str]) -> dict[str, Any] | None:
    try:
        parsed = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    return _openai_call(parsed["name"], parsed.get("arguments", parsed.get("parameters", {})))


def _llama_calls(text: str, names: Collection[str]) -> list[dict[str, Any]]:
    """Llama 3's custom-tool calls: the whole answer is one JSON call, or several joined by ';'."""
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return []
    decoder = json.JSONDecoder()
    calls = []
    at = 0
    while at < len(body):
        try:
            parsed, end = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return []
        name = parsed.get("name") if isinstance(parsed, dict) else None
        if not isinstance(name, str) or (names and name not in names):
            return []
        arguments = parsed.get("parameters", parsed.get("arguments", {}))
        calls.append(_openai_call(name, arguments))
        rest = body[end:].lstrip().removeprefix(";").lstrip()
        at = len(body) - len(rest)
    return calls


def _gemma_call(match: re.Match[str]) -> dict[str, Any] | None:
    try:
        arguments, end = _gemma_value(match.group(2), 0)
    except ValueError:
        return None
    if not isinstance(arguments, dict) or match.group(2)[end:].strip():
        return None
    return _openai_call(match.group(1), arguments)


def _gemma_value(text: str, at: int) -> tuple[Any, int]:
    """One value of Gemma 4's call syntax from `at`: <|"|>text<|"|> strings, bare or quoted keys,
    JSON's numbers, booleans, null, lists and objects. ValueError where it is not one."""
    while at < len(text) and text[at].isspace():
        at += 1
    if text.startswith(GEMMA_QUOTE, at):
        end = text.find(GEMMA_QUOTE, at + len(GEMMA_QUOTE))
        if end < 0:
            raise ValueError("an open string")
        return text[at + len(GEMMA_QUOTE) : end], end + len(GEMMA_QUOTE)
    if text.startswith('"', at):
        return json.JSONDecoder().raw_decode(text, at)
    if text.startswith("{", at) or text.startswith("[", at):
        closing = "}" if text[at] == "{" else "]"
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        at += 1
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if text.startswith(closing, at):
                return (pairs if closing == "}" else items), at + 1
            if (pairs or items) and not text.startswith(",", at):
                raise ValueError("a missing comma")
            if pairs or items:
                at += 1
            if closing == "]":
                value, at = _gemma_value(text, at)
                items.append(value)
                continue
            key_match = BARE_KEY.match(text, at)
            if key_match is not None:
                key, at = key_match.group(0), key_match.end()
            else:
                key, at = _gemma_value(text, at)
                if not isinstance(key, str):
                    raise ValueError("a key that is not text")
            if not text.startswith(":", at):
                raise ValueError("a key without ':'")
            pairs[key], at = _gemma_value(text, at + 1)
    literal = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null").match(text, at)
    if literal is None:
        raise ValueError(f"no value at {at}")
    return json.loads(literal.group(0)), literal.end()


def _openai_call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


# What a call can begin with in the formats parse_tool_calls reads (a bare Llama 3 JSON call is
# told by the answer's first character instead).
OPENINGS = ("<tool_call>", GEMMA_OPEN, PYTHON_TAG, "call:")


class CallFilter:
    """A streamed answer that was offered tools, token by token: text goes out as it comes,
    holding back only what could still become a call's opening; from an opening on, all is
    held until the end, when the held part is parsed into calls (or sent as text)."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = names
        self.held = ""
        self.calling = False  # an opening was seen: the rest is held
        self.begun = False  # the answer has shown something other than whitespace

    def push(self, text: str) -> str:
        """The text that can be sent now."""
        self.held += text
        if self.calling:
            return ""
        if not self.begun:
            start = self.held.lstrip()
            if not start:
                return ""  # whitespace may still lead up to a bare JSON call
            self.begun = True
            if start.startswith("{"):  # Llama 3's custom-tool call is the whole answer as JSON
                self.calling = True
                return ""
        found = [at for at in (self.held.find(o) for o in OPENINGS) if at >= 0]
        if found:
            at = min(found)
            out, self.held, self.calling = self.held[:at], self.held[at:], True
            return out
        keep = max((n for o in OPENINGS for n in range(1, len(o)) if self.held.endswith(o[:n])), default=0)
        out = self.held[: len(self.held) - keep]
        self.held = self.held[len(out) :]
        return out

    def finish(self) -> tuple[str | None, list[dict[str, Any]]]:
        """What was held, as text not sent yet and the calls in it."""
        held, self.held = self.held, ""
        if not held:
            return None, []
        content, calls = parse_tool_calls(held, self.names)
        return (content, calls) if calls else (held, [])
