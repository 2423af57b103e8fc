"""Structured output over HTTP: OpenAI's response_format and a forced tool call as a grammar
(localspec.core.grammar compiles them, through Runtime.constraint as the Python API does), with
a schema that cannot be used refused as a 400 naming the request field."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from localspec.api import Runtime
from localspec.common.tools import ToolRequest
from localspec.core.errors import InvalidRequestError
from localspec.core.grammar import GrammarConstraint, Grammars, json_schema_of
from localspec.server.schemas import ApiError

__all__ = ["GrammarConstraint", "GrammarRequest", "Grammars", "json_schema_of"]

T = TypeVar("T")


@dataclass(frozen=True)
class GrammarRequest:
    """What a request's text must be: a response_format's JSON, or a forced tool call (a Lark
    grammar in the model's own call format), blamed on `param` when it cannot be compiled."""

    response_format: Mapping[str, Any] | None = None
    param: str = "response_format"
    tools: ToolRequest | None = None  # a forced call, in the format of the model it runs on

    @staticmethod
    def of(response_format: Mapping[str, Any] | None, tools: ToolRequest | None = None) -> GrammarRequest | None:
        """None when the text is free; a response_format of an unknown type is a 400 now."""
        if tools is not None:
            return GrammarRequest(tools=tools, param="tools")
        if response_format is None or _blamed(json_schema_of, "response_format", response_format) is None:
            return None
        return GrammarRequest(response_format=response_format)

    def constraint(self, runtime: Runtime) -> GrammarConstraint | None:
        """The request's constraint for the model `runtime` runs, through the Python API's path."""
        if self.tools is not None:
            return _blamed(runtime.tool_constraint, self.param, self.tools)
        return _blamed(runtime.constraint, self.param, self.response_format or {})


def _blamed(make: Callable[..., T], param: str, *args: Any) -> T:
    """make(*args), its InvalidRequestError a 400 naming param."""
    try:
        return make(*args)
    except InvalidRequestError as exc:
        text = exc.message if exc.hint is None else f"{exc.message}; {exc.hint}"
        raise ApiError(400, text, param=param) from None
