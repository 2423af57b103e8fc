"""Structured output through the Python API: Runtime.generate/stream with response_format or
json_schema give exactly constrained plain decoding's answer with and without drafting, valid
for the schema (checked with jsonschema) on the real SmolLM2; a schema that cannot be used is
refused saying why."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from localspec.api import Finished, Runtime, TextDelta, runtime_for
from localspec.backends.reference import ReferenceBackend
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend
from localspec.core.sampling import SamplingConfig

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["name", "country", "population"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Paris as JSON with its name, country and population."}]
GREEDY = SamplingConfig(temperature=0)


def runtime(target: Backend, draft: Backend | None, strategy: str) -> Runtime:
    return runtime_for(target, draft, strategy=strategy, draft_tokens=0 if strategy == "none" else 4, calibrate=False)


# The same answer whatever the shared target cached before.
EXACT = {"reuse_prefix": "exact"}


@pytest.mark.model
def test_a_json_schema_answer_is_valid_and_the_same_with_and_without_drafting(
    target_backend: Backend, q8_drafter_backend: Backend
) -> None:
    answers = {}
    for strategy, draft in (("none", None), ("ngram", None), ("draft", q8_drafter_backend)):
        out = runtime(target_backend, draft, strategy).generate(
            messages=ASK, max_tokens=80, sampling=GREEDY, json_schema=CITY, **EXACT
        )
        answers[strategy] = out.text
        if strategy == "draft":
            assert out.stats.drafted > 0  # the drafter did draft under the grammar
    assert answers["ngram"] == answers["none"] == answers["draft"], answers
    jsonschema.validate(json.loads(answers["none"]), CITY)


@pytest.mark.model
def test_response_format_shapes_and_streaming_agree(target_backend: Backend) -> None:
    rt = runtime(target_backend, None, "ngram")
    wrapped = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": CITY}}
    whole = rt.generate(messages=ASK, max_tokens=80, temperature=0, response_format=wrapped, **EXACT).text
    with rt.stream(messages=ASK, max_tokens=80, temperature=0, json_schema=CITY, **EXACT) as events:
        pieces = list(events)
    assert "".join(e.text for e in pieces if isinstance(e, TextDelta)) == whole
    assert isinstance(pieces[-1], Finished) and pieces[-1].finish_reason == "stop"
    anything = rt.generate(messages=ASK, max_tokens=80, temperature=0, response_format={"type": "json_object"}, **EXACT)
    assert isinstance(json.loads(anything.text), dict)


def reference_pair(strategy: str) -> Runtime:
    target = ReferenceBackend(vocab_size=259, seed=0)
    draft = ReferenceBackend(vocab_size=259, seed=0, noise=0.5) if strategy == "draft" else None
    return runtime(target, draft, strategy)


DIGITS = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.mark.parametrize("cfg", [GREEDY, SamplingConfig(temperature=1.0, seed=3)], ids=["greedy", "sampled"])
def test_the_reference_model_drafter_keeps_constrained_output_identical(cfg: SamplingConfig) -> None:
    """Greedy: identical by construction of the acceptance rule; seeded sampling: every
    strategy's answer must at least parse (the law itself: tests/core/test_sampling_grammar.py)."""
    texts = {
        s: reference_pair(s).generate("n: ", max_tokens=24, sampling=cfg, json_schema=DIGITS, **EXACT)
        for s in ("none", "draft")
    }
    if cfg.greedy:
        assert texts["draft"].text == texts["none"].text
    for out in texts.values():
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), DIGITS)


BAD: dict[str, tuple[Callable[[Runtime], Any], str]] = {
    "unknown-type": (lambda rt: rt.generate("x", response_format={"type": "xml"}), "'xml' is not supported"),
    "bad-schema": (lambda rt: rt.generate("x", json_schema={"type": "no-such-type"}), "json_schema cannot be used"),
    "not-a-dict": (lambda rt: rt.generate("x", json_schema="[]"), "json_schema must be a dict"),  # type: ignore[arg-type]
    "both": (
        lambda rt: rt.generate("x", json_schema=DIGITS, response_format={"type": "json_object"}, **EXACT),
        "not both",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_a_schema_that_cannot_be_used_is_refused_saying_why(case: str) -> None:
    call, message = BAD[case]
    with pytest.raises(InvalidRequestError) as caught:
        call(reference_pair("none"))
    assert message in str(caught.value)
