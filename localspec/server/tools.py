"""Tools (function calling) through the chat: the functions are described in a system block and
calls are written as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, Hermes' format,
which Qwen's own chat template writes and which instruction-tuned models of other families
follow from the description; calls are parsed back into OpenAI's `tool_calls`.
tool_choice "required" or a named function is forced by a grammar."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.server.schemas import ApiError

# Qwen2.5's chat template's own words, which models trained on Hermes-style calls know.
TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolRequest:
    """The functions a chat request offers, and whether the answer must call one."""

    functions: tuple[Mapping[str, Any], ...]  # OpenAI's function objects: name, description, parameters
    forced: bool

    def messages(self, chat: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The chat with the tools described in its system message, and earlier calls and
        results written as the model reads them (templates without tools drop tool_calls)."""
        listed = "\n".join(json.dumps({"type": "function", "function": dict(f)}) for f in self.functions)
        intro = TOOLS_INTRO.format(tools=listed)
        out: list[dict[str, Any]] = []
        for message in chat:
            if message["role"] == "assistant" and message.get("tool_calls"):
                calls = [_call_text(call) for call in message["tool_calls"]]
                text = "\n".join([message["content"], *calls] if message["content"] else calls)
                out.append({"role": "assistant", "content": text})
            elif message["role"] == "tool":
                out.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
            else:
                out.append(dict(message))
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{intro}"
        else:
            out.insert(0, {"role": "system", "content": intro})
        return out

    def grammar(self) -> str:
        """A Lark grammar (llguidance's, with %json) for exactly one call of one of the functions."""
        schemas = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    "arguments": f.get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in self.functions
        ]
        call = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {json.dumps(call)}\n'


def tool_request(tools: Sequence[Any] | None, tool_choice: Any) -> ToolRequest | None:
    """What a request's tools and tool_choice ask for; None: answer in text."""
    if not tools or tool_choice == "none":
        return None
    functions = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) and tool.get("type") == "function" else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ApiError(
                400, "each tool must be {'type': 'function', 'function': {'name': ...}}", param=f"tools[{i}]"
            )
        functions.append(function)
    if tool_choice in (None, "auto"):
        return ToolRequest(tuple(functions), forced=False)
    if tool_choice == "required":
        return ToolRequest(tuple(functions), forced=True)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, Mapping) else None
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise ApiError(
            400, "tool_choice must be 'none', 'auto', 'required' or a function among the tools", param="tool_choice"
        )
    return ToolRequest(tuple(chosen), forced=True)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text outside its calls (None when nothing is left) and its calls in
    OpenAI's shape; a block that is not a JSON call stays text."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    cursor = 0
    for match in CALL.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            continue
        kept.append(text[cursor : match.start()])
        cursor = match.end()
        calls.append(call)
    kept.append(text[cursor:])
    rest = "".join(kept).strip()
    return (rest or None) if calls else text, calls


def _parse_call(body: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": parsed["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function", {})
    arguments = function.get("arguments", "{}")
    with contextlib.suppress(json.JSONDecodeError):  # else kept as the client sent it
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    return f"<tool_call>\n{json.dumps({'name': function.get('name'), 'arguments': arguments})}\n</tool_call>"
