"""Structured output: `response_format` (json_object, json_schema) as a TokenConstraint over the
target's vocabulary, through llguidance (Microsoft's grammar engine behind llama.cpp's and
vLLM's guidance support: JSON schemas compiled to a grammar, token masks in microseconds)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from localspec.core.protocol import Backend
from localspec.server.schemas import ApiError
from localspec.server.tools import ToolRequest, tool_style

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON: with free whitespace a small model can fill its answer with newlines.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


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
        if response_format is None or json_schema_of(response_format) is None:
            return None
        return GrammarRequest(response_format=response_format)

    def constraint(self, grammars: Grammars) -> GrammarConstraint | None:
        if self.tools is not None:
            return grammars.lark(self.tools.grammar(grammars.tool_style.format, grammars.spell), self.param)
        return grammars.constraint(self.response_format or {})


class GrammarConstraint:
    """One request's grammar state: the text so far is what the matcher consumed."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab

    def allowed_prefix(self, draft: Sequence[int]) -> int:
        return int(self.matcher.validate_tokens(list(draft))) if draft else 0

    def mask(self, rows: npt.NDArray[np.floating], draft: Sequence[int], start: int = 0) -> None:
        ahead = 0
        if start:
            self.matcher.consume_tokens(list(draft[:start]))
            ahead = start
        for i, row in enumerate(rows):
            if i:
                self.matcher.consume_token(draft[start + i - 1])
                ahead += 1
            allowed = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)[: self.n_vocab]
            row[: allowed.size][allowed == 0] = -np.inf
            row[allowed.size :] = -np.inf
        if ahead:
            self.matcher.rollback(ahead)

    def commit(self, tokens: Sequence[int]) -> None:
        self.matcher.consume_tokens(list(tokens))


class Grammars:
    """A model's llguidance tokenizer, built once (one pass over the vocabulary), and the
    constraints requests ask for."""

    def __init__(self, target: Backend) -> None:
        import llguidance

        identity = target.vocab_identity()
        eog = sorted(target.end_of_generation())
        tokens = []
        for i in range(target.info.n_vocab):
            raw = target.token_bytes(i)
            # Tokens with no text (control tokens) are llguidance's special tokens: 0xFF + name.
            name = identity.token_texts[i] if i < len(identity.token_texts) else b""
            tokens.append(raw if raw and i not in eog else b"\xff" + (name or f"<special_{i}>".encode()))
        wrapper = _Vocabulary(tokens, eog[0] if eog else 0, identity.bos, target)
        self.n_vocab = target.info.n_vocab
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper), eos_token=eog or None)
        self.tool_style = tool_style(target.chat_template())
        self._target = target
        self._special = frozenset(wrapper.special_token_ids)

    def spell(self, marker: str) -> str:
        """A marker as a Lark grammar names it: `<[id]>` where the vocabulary has it as one
        special token (a control token has no text to match), else its text."""
        ids = self._target.tokenize(marker, add_special=False, parse_special=True)
        if len(ids) == 1 and ids[0] in self._special:
            return f"<[{ids[0]}]>"
        return json.dumps(marker)

    def constraint(self, response_format: Mapping[str, Any]) -> GrammarConstraint | None:
        """None for plain text; a 400 naming response_format for what cannot be compiled."""
        import llguidance

        schema = json_schema_of(response_format)
        if schema is None:
            return None
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        except ValueError as exc:
            raise ApiError(400, f"the JSON schema cannot be used: {exc}", param="response_format") from None
        return self._constraint(grammar, "response_format")

    def lark(self, grammar: str, param: str) -> GrammarConstraint:
        """A constraint from a Lark grammar (llguidance's dialect, %json included); param: the
        request field a grammar that cannot be compiled is blamed on."""
        import llguidance

        try:
            compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
        except ValueError as exc:
            raise ApiError(400, f"'{param}' cannot be turned into a grammar: {exc}", param=param) from None
        return self._constraint(compiled, param)

    def _constraint(self, grammar: str, param: str) -> GrammarConstraint:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ApiError(400, f"'{param}' cannot be used: {matcher.get_error()}", param=param)
        return GrammarConstraint(matcher, self.n_vocab)


def json_schema_of(response_format: Mapping[str, Any]) -> dict[str, Any] | None:
    """The schema a response_format asks for: any JSON object for json_object; None for text."""
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            return {"type": "object"}
        if not isinstance(schema, Mapping):
            raise ApiError(400, "'response_format.json_schema.schema' must be an object", param="response_format")
        copied: dict[str, Any] = json.loads(json.dumps(schema))  # plain JSON types only
        return copied
    raise ApiError(
        400, f"response_format type {kind!r} is not supported: use json_object or json_schema", param="response_format"
    )


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tokens: list[bytes], eos: int, bos: int | None, target: Backend) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = bos
        self.special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(b"\xff")]
        self._target = target

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._target.tokenize(text, add_special=False, parse_special=False)
