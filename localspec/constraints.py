"""What a request's answer must match: the JSON a response_format or a JSON schema asks for,
or a forced tool call, compiled by the target's grammar engine, built once on first use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localspec.common.tools import ToolRequest, tool_style
from localspec.core.errors import InvalidRequestError
from localspec.core.grammar import GrammarConstraint, Grammars, is_schema_model, json_schema_of
from localspec.core.protocol import Backend


class Constraints:
    """A target's constraints, each fresh for one request (it keeps that request's grammar state)."""

    def __init__(self, target: Backend) -> None:
        self.target = target
        self._grammars: Grammars | None = None

    @property
    def grammars(self) -> Grammars:
        """The target's grammar engine (llguidance's tokenizer, one pass over the vocabulary,
        built on first use), which compiles the constraints requests ask for."""
        if self._grammars is None:
            self._grammars = Grammars(self.target)
        return self._grammars

    def answer(
        self, response_format: Mapping[str, Any] | type | None, json_schema: Mapping[str, Any] | type | None
    ) -> GrammarConstraint | None:
        """The JSON an OpenAI response_format, a JSON schema or a pydantic model class asks
        for; None for free text (Runtime.constraint says how strict)."""
        if response_format is not None and json_schema is not None:
            raise InvalidRequestError("give response_format= or json_schema=, not both")
        if json_schema is not None:
            if not isinstance(json_schema, Mapping) and not is_schema_model(json_schema):
                raise InvalidRequestError(
                    f"json_schema must be a dict (a JSON schema) or a pydantic model class, "
                    f"got {type(json_schema).__name__}",
                    'e.g. json_schema={"type": "object", "properties": {"name": {"type": "string"}}}',
                )
            schema = json_schema_of({"type": "json_schema", "json_schema": {"schema": json_schema}})
            return None if schema is None else self.grammars.json_schema(schema, "json_schema")
        if response_format is None:
            return None
        schema = json_schema_of(response_format)
        return None if schema is None else self.grammars.json_schema(schema)

    def tool_call(self, tools: ToolRequest) -> GrammarConstraint:
        """A forced call's grammar, in the call format the model's template implies (one of the
        offered functions, its arguments valid for its schema)."""
        grammars = self.grammars
        style = tool_style(self.target.chat_template())
        return grammars.lark(tools.grammar(style.format, grammars.spell), "tools")
