"""Tools (function calling) through the chat. Where the model's chat template reads `tools`
(as transformers and llama-server pass them), the template describes the functions and writes
earlier calls in the model's own format; otherwise the functions are described in a system
block in Hermes' words (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, which Qwen's
template writes and instruction-tuned models of other families follow). Answers are parsed
(tool_parsing.py) for the formats of the registry's families: Hermes' <tool_call> (Qwen, SmolLM2), Llama 3's
bare JSON `{"name": ..., "parameters": ...}` (after <|python_tag|> or not), and Gemma 4's
`<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>` (Gemma 3's template has no tools:
it gets the Hermes block). tool_choice "required" or a named function is forced by a grammar
in the format the model was prompted with. serve and the Python API (Runtime's tools=) share
this module: the same prompt, the same grammar, the same parse."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from localspec.common.templates import takes_tools
from localspec.common.tool_parsing import BARE_KEY, GEMMA_CLOSE, GEMMA_OPEN, GEMMA_QUOTE, PYTHON_TAG

# server/app.py reads these two here, where they were before tool_parsing.py.
from localspec.common.tool_parsing import CallFilter as CallFilter
from localspec.common.tool_parsing import parse_tool_calls as parse_tool_calls
from localspec.core.errors import InvalidRequestError
from localspec.core.grammar import closed, is_schema_model, rebased

# Qwen2.5's chat template's own words, which models trained on Hermes-style calls know.
TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
HERMES = "hermes"
LLAMA3 = "llama3"
GEMMA4 = "gemma4"

M = TypeVar("M")


class ToolRequestError(InvalidRequestError):
    """tools or tool_choice that cannot be used; param: the request field to blame (serve's 400 names it)."""

    def __init__(self, message: str, param: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.param = param


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as the JSON text the
    model wrote (OpenAI's function.arguments); args() and parse() read them."""

    id: str
    name: str
    arguments: str

    def args(self) -> Any:
        """The arguments as Python values (a dict for an object); ValueError where they are no JSON."""
        return json.loads(self.arguments)

    def parse(self, model: type[M]) -> M:
        """The arguments validated as a pydantic model (the class passed in tools=), raising
        pydantic's ValidationError where they do not fit it."""
        validate: Callable[[str], M] = getattr(model, "model_validate_json")  # noqa: B009
        return validate(self.arguments)

    def openai(self) -> dict[str, Any]:
        """OpenAI's tool_call object, as serve writes it (and as a chat's next turn takes it)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @staticmethod
    def of(call: Mapping[str, Any]) -> ToolCall:
        function = call["function"]
        return ToolCall(str(call["id"]), str(function["name"]), str(function["arguments"]))


@dataclass(frozen=True)
class ToolStyle:
    """How a model is told about tools: `native` where its template renders them itself, and
    the format its calls are written in (the grammar forces that one)."""

    format: str
    native: bool


def tool_style(template: str | None) -> ToolStyle:
    """The style a chat template implies: its own markers, else Hermes' system block."""
    if not takes_tools(template):
        return ToolStyle(HERMES, native=False)
    assert template is not None
    if GEMMA_OPEN in template:
        return ToolStyle(GEMMA4, native=True)
    if "<tool_call>" in template:
        return ToolStyle(HERMES, native=True)
    if PYTHON_TAG in template or '"parameters"' in template:
        return ToolStyle(LLAMA3, native=True)
    return ToolStyle(HERMES, native=True)  # a template of its own: Hermes is what the parser reads first


@dataclass(frozen=True)
class ToolRequest:
    """The functions a chat request offers, and whether the answer must call one."""

    functions: tuple[Mapping[str, Any], ...]  # OpenAI's function objects: name, description, parameters
    forced: bool

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f["name"] for f in self.functions)

    def tools(self) -> list[dict[str, Any]]:
        """The functions as OpenAI's tool objects, the `tools` a template reads."""
        return [{"type": "function", "function": dict(f)} for f in self.functions]

    def native_messages(self, chat: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The chat for a template that renders tools: each earlier call's arguments as an object
        (templates write them with tojson or iterate them, as transformers passes them)."""
        out: list[dict[str, Any]] = []
        for message in chat:
            if message["role"] == "assistant" and message.get("tool_calls"):
                calls = []
                for call in message["tool_calls"]:
                    function = dict(call.get("function", {}))
                    function["arguments"] = _arguments(function.get("arguments", "{}"))
                    calls.append({**call, "function": function})
                out.append({**message, "tool_calls": calls})
            else:
                out.append(dict(message))
        return out

    def messages(self, chat: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The chat with the tools described in its system message, and earlier calls and
        results written as the model reads them (templates without tools drop tool_calls)."""
        listed = "\n".join(json.dumps(tool) for tool in self.tools())
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

    def grammar(self, form: str = HERMES, spell: Callable[[str], str] = json.dumps) -> str:
        """A Lark grammar (llguidance's, with %json) for exactly one call of one of the functions
        in `form`; spell(marker) writes a marker as the grammar names it (one special token's
        id where the vocabulary has it as one, else its text)."""
        if form == GEMMA4:
            return _gemma_grammar(self.functions, spell)
        arguments = "parameters" if form == LLAMA3 else "arguments"
        single = len(self.functions) == 1
        schemas = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    # The parameters sit inside the call's schema, so their own "#/..." pointers
                    # ($defs of a nested pydantic model) are rewritten to where they now are.
                    arguments: rebased(
                        closed(f.get("parameters") or {"type": "object"}),
                        f"#{'' if single else f'/anyOf/{i}'}/properties/{arguments}",
                    ),
                },
                "required": ["name", arguments],
                "additionalProperties": False,
            }
            for i, f in enumerate(self.functions)
        ]
        call = schemas[0] if single else {"anyOf": schemas}
        # Compact JSON, as for response_format: with free whitespace a model can fill the call with newlines.
        call = {**call, "x-guidance": {"whitespace_flexible": False}}
        if form == LLAMA3:
            return f"start: call\ncall: %json {json.dumps(call)}\n"
        start = f'start: {spell("<tool_call>")} "\\n" call "\\n" {spell("</tool_call>")}'
        return f"{start}\ncall: %json {json.dumps(call)}\n"


def with_calls(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A chat whose assistant turns may hold ToolCall values (a Completion's tool_calls) and no
    content (OpenAI's shape of a turn that only called), in the dicts the templates read."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        if not calls:
            out.append(message if isinstance(message, dict) else dict(message))
            continue
        written = [call.openai() if isinstance(call, ToolCall) else call for call in calls]
        content = message.get("content")
        out.append({**message, "content": "" if content is None else content, "tool_calls": written})
    return out


def tool_request(tools: Sequence[Any] | None, tool_choice: Any) -> ToolRequest | None:
    """What a request's tools and tool_choice ask for; None: answer in text. A tool is OpenAI's
    {"type": "function", "function": {...}} or a pydantic model class (its name, docstring and
    schema); tool_choice is None, "none", "auto", "required", {"type": "function", "function":
    {"name": ...}} or an offered model class. A tool_choice that forces a call without tools,
    or parameters that are no schema, raise ToolRequestError naming the field."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise ToolRequestError("tool_choice forces a function call, but the request has no 'tools'", "tool_choice")
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ToolRequestError(
            f"tools must be a list of tools, got {type(tools).__name__}", "tools", "e.g. tools=[Weather] or [WEATHER]"
        )
    if tool_choice == "none":
        return None
    functions = [_function(tool, i) for i, tool in enumerate(tools)]
    if tool_choice in (None, "auto"):
        return ToolRequest(tuple(functions), forced=False)
    if tool_choice == "required":
        return ToolRequest(tuple(functions), forced=True)
    if is_schema_model(tool_choice):
        name = tool_choice.__name__
    else:
        name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, Mapping) else None
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise ToolRequestError(
            "tool_choice must be 'none', 'auto', 'required' or a function among the tools", "tool_choice"
        )
    return ToolRequest(tuple(chosen), forced=True)


def _function(tool: Any, i: int) -> Mapping[str, Any]:
    """A tool's OpenAI function object: given as one, or made from a pydantic model class."""
    if is_schema_model(tool):
        made = {"name": tool.__name__, "parameters": tool.model_json_schema()}
        doc = (tool.__doc__ or "").strip()
        return {**made, "description": doc} if doc else made
    function = tool.get("function") if isinstance(tool, Mapping) and tool.get("type") == "function" else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ToolRequestError(
            "each tool must be {'type': 'function', 'function': {'name': ...}} or a pydantic model class", f"tools[{i}]"
        )
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ToolRequestError(
            f"tools[{i}].function.parameters must be a JSON schema object, got {type(parameters).__name__}: "
            'e.g. {"type": "object", "properties": {"city": {"type": "string"}}}',
            f"tools[{i}].function.parameters",
        )
    return function


def _gemma_grammar(functions: Sequence[Mapping[str, Any]], spell: Callable[[str], str]) -> str:
    """Gemma 4's call syntax in Lark: each function's name, then its parameters' object with
    the schema's types where they are plain (strings, enums, numbers, booleans, objects whose
    properties are all required, lists), any Gemma value elsewhere."""
    quote = spell(GEMMA_QUOTE)
    rules: list[str] = []

    def value(schema: Any) -> str:
        if not isinstance(schema, Mapping):
            return "gvalue"
        if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            return "(" + " | ".join(f"{quote} {json.dumps(v)} {quote}" for v in schema["enum"]) + ")"
        kind = schema.get("type")
        if kind == "string":
            if isinstance(schema.get("maxLength"), int):  # a terminal of its own: /[^<]{0,n}/
                rules.append(f"GSTR{len(rules)}: /[^<]{{0,{schema['maxLength']}}}/")
                return f"{quote} GSTR{len(rules) - 1} {quote}"
            return f"{quote} GSTR {quote}"
        if kind == "integer":
            low, high = schema.get("minimum"), schema.get("maximum")
            if isinstance(low, int) and isinstance(high, int) and 0 <= high - low < 256:  # a small range: each value
                return "(" + " | ".join(f'"{n}"' for n in range(low, high + 1)) + ")"
            return "GINT"
        if kind == "number":
            return "GNUM"
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "array":
            item = value(schema.get("items"))
            return f'("[" ({item} ("," {item})*)? "]")'
        if kind == "object" and isinstance(schema.get("properties"), Mapping):
            properties = schema["properties"]
            if set(schema.get("required", ())) >= set(properties):  # all required: in declared order
                parts = [f'{_gemma_key(k, quote)} ":" {value(v)}' for k, v in properties.items()]
                return '("{" ' + ' "," '.join(parts) + ' "}")' if parts else '("{" "}")'
            at = len(rules)
            rules.append("")  # this object's rule, named before its properties add theirs
            name = f"gobj{at}"
            items = " | ".join(f'{_gemma_key(k, quote)} ":" {value(v)}' for k, v in properties.items())
            rules[at] = f"{name}: {items}"
            return f'("{{" ({name} ("," {name})*)? "}}")'
        return "gvalue"

    calls = [f'"call:" {json.dumps(f["name"])} {value(f.get("parameters") or {"type": "object"})}' for f in functions]
    return "\n".join(
        [
            f"start: {spell(GEMMA_OPEN)} ({' | '.join(calls)}) {spell(GEMMA_CLOSE)}",
            *rules,
            f'gvalue: {quote} GSTR {quote} | GNUM | "true" | "false" | "null" | gobject | glist',
            'gobject: "{" (gpair ("," gpair)*)? "}"',
            'gpair: GKEY ":" gvalue',
            'glist: "[" (gvalue ("," gvalue)*)? "]"',
            "GKEY: /[A-Za-z_][A-Za-z0-9_]*/",
            "GSTR: /[^<]*/",
            "GINT: /-?(0|[1-9][0-9]{0,15})/",
            "GNUM: /-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,16})?/",
            "",
        ]
    )


def _gemma_key(key: str, quote: str) -> str:
    return json.dumps(key) if BARE_KEY.fullmatch(key) else f"{quote} {json.dumps(key)} {quote}"


def _arguments(arguments: Any) -> Any:
    """A call's arguments as an object where they are a JSON object's text, else as given."""
    with contextlib.suppress(json.JSONDecodeError, TypeError):
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    return arguments


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function", {})
    arguments = _arguments(function.get("arguments", "{}"))
    return f"<tool_call>\n{json.dumps({'name': function.get('name'), 'arguments': arguments})}\n</tool_call>"
