"""Per-request speculation through `localspec serve` (issue 57 item 4): localspec's own
`speculation` field and llama-server's speculative.* fields, mapped onto the request's
Speculation; a field that changes nothing here is named in the warning header; with
speculation off a greedy answer is the one the runtime gives by default, bit for bit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_support import MODEL, serving

from localspec.server import LocalServer
from localspec.server.schemas import WARNING_HEADER, ApiError, ChatRequest
from localspec.server.speculation import requested
from localspec.strategies import Speculation

httpx = pytest.importorskip("httpx")

LOOPING = "one two three four, one two three four, one two three four, one two"
HI = [{"role": "user", "content": "hi"}]


def asked(**fields: Any) -> tuple[Speculation | None, list[str]]:
    got = requested(ChatRequest.model_validate({"model": "m", "messages": HI, **fields}))
    return got.speculation, got.no_effect


def test_a_request_without_speculation_fields_keeps_the_runtimes_own() -> None:
    assert asked() == (None, [])


def test_localspecs_own_field_maps_onto_the_requests_speculation() -> None:
    assert asked(speculation={"strategy": "none"})[0] == Speculation("none")
    assert asked(speculation={"draft_tokens": 3, "max_draft": 5})[0] == Speculation("auto", 3, 5)


def test_llama_servers_fields_map_and_those_without_effect_are_named() -> None:
    assert asked(**{"speculative.n_max": 6}) == (Speculation(max_draft=6), [])
    assert asked(**{"speculative.types": []})[0] == Speculation("none")
    assert asked(**{"speculative.types": "none"})[0] == Speculation("none")
    assert asked(**{"speculative.type": "none"})[0] == Speculation("none")
    assert asked(**{"speculative.p_min": 0.5}) == (Speculation(min_confidence=0.5), [])
    spec, no_effect = asked(**{"speculative.n_min": 2, "speculative.types": ["ngram-simple"]})
    assert spec == Speculation()
    assert [name.split(" ")[0] for name in no_effect] == ["speculative.n_min", "speculative.types"]
    # localspec's own field wins where both say something
    assert asked(speculation={"max_draft": 2}, **{"speculative.n_max": 9})[0] == Speculation(max_draft=2)
    own = asked(speculation={"min_confidence": 0.1}, **{"speculative.p_min": 0.9})[0]
    assert own == Speculation(min_confidence=0.1)


def test_llama_servers_fields_as_one_speculative_object_or_a_switch() -> None:
    assert asked(speculative={"n_max": 6}) == (Speculation(max_draft=6), [])
    assert asked(speculative={"types": []})[0] == Speculation("none")
    assert asked(speculative=False)[0] == Speculation("none")
    assert asked(speculative=True) == (None, [])
    _, no_effect = asked(speculative={"n_min": 2})
    assert [name.split(" ")[0] for name in no_effect] == ["speculative.n_min"]
    assert asked(speculative={"p_min": 0.75}) == asked(**{"speculative.p_min": 0.75})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"speculative": {"gamma": 4}}, "speculative.gamma"),
        ({"speculative": "yes"}, "speculative"),
        ({"speculative": {"n_max": -2}}, "speculative.n_max"),
        ({"speculative.n_max": -1}, "speculative.n_max"),
        ({"speculative.p_min": 2}, "speculative.p_min"),
        ({"speculation": {"min_confidence": -0.1}}, "speculation.min_confidence"),
        ({"speculation": {"min_confidence": "high"}}, "speculation.min_confidence"),
        ({"speculative.types": 3}, "speculative.types"),
        ({"speculation": {"draft_tokens": "many"}}, "speculation.draft_tokens"),
        ({"speculation": {"gamma": 4}}, "speculation.gamma"),
    ],
)
def test_a_speculation_value_of_the_wrong_kind_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        asked(**fields)
    assert caught.value.status == 400 and caught.value.param == param


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    with serving(smollm2_q4_1) as srv:
        yield srv


def complete(server: LocalServer, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": LOOPING, "max_tokens": 32, "temperature": 0, **fields}
    return httpx.post(f"{server.url}/completions", json=body, timeout=120)


@pytest.mark.model
def test_speculation_off_per_request_gives_the_default_answer_bit_for_bit(server: LocalServer) -> None:
    default = complete(server).json()
    assert default["speculation"]["drafted_tokens"] > 0  # the loaded runtime drafts (n-gram lookup)
    for off in ({"speculation": {"strategy": "none"}}, {"speculative.types": []}, {"speculative.n_max": 0}):
        plain = complete(server, **off)
        assert plain.status_code == 200 and WARNING_HEADER not in plain.headers
        figures = plain.json()["speculation"]
        assert figures["drafted_tokens"] == 0 and figures["strategy"] == "none"
        assert plain.json()["choices"][0]["text"] == default["choices"][0]["text"], off
    assert complete(server).json()["choices"][0]["text"] == default["choices"][0]["text"]  # and back


@pytest.mark.model
def test_a_field_without_effect_is_answered_with_the_warning_header(server: LocalServer) -> None:
    answer = complete(server, **{"speculative.n_min": 2, "speculative.n_max": 3})
    assert answer.status_code == 200
    assert "speculative.n_min" in answer.headers[WARNING_HEADER]
    assert "speculative.n_max" not in answer.headers[WARNING_HEADER]  # it maps: the longest draft


@pytest.mark.model
def test_a_strategy_the_model_was_not_loaded_with_is_a_400(server: LocalServer) -> None:
    answer = complete(server, speculation={"strategy": "draft"})
    assert answer.status_code == 400 and "cannot switch to 'draft'" in answer.json()["error"]["message"]
