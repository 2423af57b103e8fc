"""Structured output: a JSON schema (or OpenAI's response_format shapes) as a TokenConstraint
over the target's vocabulary, through llguidance (Microsoft's grammar engine behind llama.cpp's
and vLLM's guidance support: JSON schemas compiled to a grammar, token masks in microseconds)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON: with free whitespace a small model can fill its answer with newlines.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


# The finish reason of an answer whose grammar allowed no token at some point: a schema that
# no finite JSON value satisfies (an object that must contain itself), or one too complex
# for the grammar engine to follow. Never "stop": the text is not what the schema asked for.
GRAMMAR_DEAD_END = "grammar_error"


class GrammarConstraint:
    """One request's grammar state: the text so far is what the matcher consumed.

    Where the grammar allows no token at all, the row allows only the end of generation and
    the position is kept (dead_ends), so the request ends there with GRAMMAR_DEAD_END rather
    than a token no grammar chose."""

    def __init__(self, matcher: Any, n_vocab: int, eog: Sequence[int] = ()) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab
        self.eog = [t for t in eog if 0 <= t < n_vocab]
        self.committed = 0  # tokens of the answer so far
        self.dead_ends: dict[int, str] = {}  # position in the answer -> why nothing was allowed

    def ended_at_dead_end(self, generated: int) -> bool:
        """Whether an answer of `generated` tokens ended because its grammar allowed nothing more."""
        return generated in self.dead_ends

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
            if self.matcher.is_error() or not (allowed.any() or self.matcher.is_stopped()):
                why = self.matcher.get_error().strip().splitlines()
                self.dead_ends[self.committed + start + i] = why[0] if why else "no token allowed"
                allowed = np.zeros(self.n_vocab, dtype=np.uint8)
                allowed[self.eog] = 1
            row[: allowed.size][allowed == 0] = -np.inf
            row[allowed.size :] = -np.inf
        if ahead and not self.matcher.is_error():
            self.matcher.rollback(ahead)

    def commit(self, tokens: Sequence[int]) -> None:
        if not self.matcher.is_error():
            self.matcher.consume_tokens(list(tokens))
        self.committed += len(tokens)

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (llguidance's jump-forward: the canonical
        tokenization of the only bytes it allows), empty where it allows a choice."""
        if self.matcher.is_stopped():
            return []
        return [t for t in self.matcher.compute_ff_tokens() if 0 <= t < self.n_vocab]


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
        self.eog = eog
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper), eos_token=eog or None)
        self.target = target
        self._special = frozenset(wrapper.special_token_ids)

    def spell(self, marker: str) -> str:
        """A marker as a Lark grammar names it: `<[id]>` where the vocabulary has it as one
        special token (a control token has no text to match), else its text."""
        ids = self.target.tokenize(marker, add_special=False, parse_special=True)
        if len(ids) == 1 and ids[0] in self._special:
            return f"<[{ids[0]}]>"
        return json.dumps(marker)

    def constraint(self, response_format: Mapping[str, Any]) -> GrammarConstraint | None:
        """None for plain text ({"type": "text"}); InvalidRequestError for what cannot be compiled."""
        schema = json_schema_of(response_format)
        return None if schema is None else self.json_schema(schema)

    def json_schema(self, schema: Mapping[str, Any], param: str = "response_format") -> GrammarConstraint:
        """A constraint to JSON valid for `schema`; param: what the caller calls the schema."""
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(dict(schema), overrides=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(
                f"the JSON schema in {param} cannot be used: {exc}",
                'give a JSON schema object (https://json-schema.org), e.g. {"type": "object"}',
            ) from None
        return self._constraint(grammar, param)

    def lark(self, grammar: str, param: str) -> GrammarConstraint:
        """A constraint from a Lark grammar (llguidance's dialect, %json included); param: the
        request field a grammar that cannot be compiled is blamed on."""
        import llguidance

        try:
            compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
        except ValueError as exc:
            raise InvalidRequestError(f"{param} cannot be turned into a grammar: {exc}") from None
        return self._constraint(compiled, param)

    def _constraint(self, grammar: str, param: str) -> GrammarConstraint:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{param} cannot be used: {matcher.get_error()}")
        # The first mask, now: a schema no text satisfies (a $ref that only refers to itself)
        # allows no first token, and is refused before anything is generated.
        first = np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[: self.n_vocab]
        if matcher.is_error() or not first.any():
            reason = matcher.get_error().strip().splitlines()[0] if matcher.is_error() else "no text satisfies it"
            raise InvalidRequestError(
                f"{param} cannot be satisfied: {reason}",
                "check the schema: a $ref that only refers to itself, or a type no value has, matches nothing",
            )
        return GrammarConstraint(matcher, self.n_vocab, self.eog)


def json_schema_of(response_format: Mapping[str, Any] | type) -> dict[str, Any] | None:
    """The schema an OpenAI response_format asks for: any JSON object for json_object, the
    given schema for json_schema (or a pydantic model class's); None for text. Strict unless
    json_schema says "strict": false: an object that lists properties is closed to other
    keys where the schema does not say (OpenAI's strict mode, llama.cpp's reading), since an
    open one lets a small model add keys until max_tokens."""
    if is_schema_model(response_format):
        made: dict[str, Any] = closed(plain_json(getattr(response_format, "model_json_schema")(), "the model's schema"))  # noqa: B009
        return made
    if not isinstance(response_format, Mapping):
        raise InvalidRequestError(
            f"response_format must be a dict, got {type(response_format).__name__}",
            'use {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}}}',
        )
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
        if is_schema_model(schema):
            schema = schema.model_json_schema()
        if not isinstance(schema, Mapping):
            raise InvalidRequestError("response_format's json_schema.schema must be an object (a JSON schema)")
        copied = plain_json(schema, "response_format's json_schema.schema")
        return copied if isinstance(spec, Mapping) and spec.get("strict") is False else closed(copied)
    raise InvalidRequestError(f"response_format type {kind!r} is not supported", "use json_object, json_schema or text")


def is_schema_model(value: Any) -> bool:
    """Whether value is a pydantic model class (anything with model_json_schema), not an instance."""
    return isinstance(value, type) and callable(getattr(value, "model_json_schema", None))


def plain_json(schema: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A copy of schema in plain JSON types, or InvalidRequestError naming `what`."""
    try:
        copied: dict[str, Any] = json.loads(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{what} is not plain JSON: {exc}") from None
    return copied


def closed(schema: Any) -> Any:
    """The schema with objects that list properties closed to others where it does not say
    (llama.cpp's reading, and OpenAI's strict one): else a small model fills a call with keys."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {
        k: closed(v) if k in ("items", "anyOf", "oneOf", "allOf", "$defs", "definitions") else v
        for k, v in schema.items()
    }
    if isinstance(schema.get("properties"), Mapping):
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), Mapping):
            out[key] = {k: closed(v) for k, v in schema[key].items()}
    return out


def rebased(schema: Any, at: str) -> Any:
    """The schema with each local "$ref" ("#", "#/$defs/A") pointing under `at`, the pointer
    to where the schema now sits inside a larger one."""
    if isinstance(schema, list):
        return [rebased(s, at) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: rebased(v, at) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = at + ref[1:]
    return out


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
