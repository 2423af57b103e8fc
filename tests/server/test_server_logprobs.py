"""`logprobs`, `top_logprobs`, `frequency_penalty`, `presence_penalty` and `logit_bias` on
`localspec serve`, through the official `openai` client: logprobs are the target's own
(identical to plain decoding's while the server drafts with n-gram lookup), penalties change
the text as plain penalised decoding does, and bad values are 400s naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_support import MODEL, fresh_plain, serving

from localspec.api import Runtime
from localspec.core.sampling import LogprobRecorder, SamplingConfig
from localspec.server import LocalServer

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.model

RIVERS = [{"role": "user", "content": "Name three rivers."}]
COUNTING = "1, 2, 3, 4, 5, 6,"


@pytest.fixture(scope="module")
def server(smollm2_q4_1: Path) -> Iterator[LocalServer]:
    with serving(smollm2_q4_1) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LocalServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def plain(smollm2_q4_1: Path) -> Iterator[Runtime]:
    """Plain decoding, every prompt evaluated as a fresh request would be."""
    with fresh_plain(smollm2_q4_1) as runtime:
        yield runtime


def plain_logprobs(runtime: Runtime, top: int, **request: Any) -> tuple[str, LogprobRecorder]:
    recorder = LogprobRecorder(top, runtime.target.token_bytes)
    done = runtime.generate(**request, sampling=SamplingConfig(temperature=0, logprobs=recorder), reuse_prefix="exact")
    return done.text, recorder


def test_chat_logprobs_are_plain_decodings_while_the_server_drafts(client, plain) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=RIVERS, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3
    )
    assert answer.model_extra["speculation"]["drafted_tokens"] > 0
    text, recorder = plain_logprobs(plain, 3, messages=RIVERS, max_tokens=24)
    content = answer.choices[0].logprobs.content
    assert answer.choices[0].message.content == text == "".join(t.token for t in content)
    assert [t.logprob for t in content] == pytest.approx([e.logprob for e in recorder.entries], abs=1e-4)
    for token in content:
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)
        assert token.top_logprobs[0].token == token.token  # greedy takes the most likely token
        assert bytes(token.bytes) == token.token.encode()


def test_streamed_logprobs_come_with_the_text_they_produced(client) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=RIVERS, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2
    )
    chunks = client.chat.completions.create(
        model=MODEL, messages=RIVERS, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = []
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            assert "".join(t.token for t in chunk.choices[0].logprobs.content) == chunk.choices[0].delta.content
            streamed += chunk.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole.choices[0].logprobs.content]


def test_completions_logprobs_take_the_older_shape(client) -> None:
    answer = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=8, temperature=0, logprobs=2)
    lp = answer.choices[0].logprobs
    assert "".join(lp.tokens) == answer.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset[0] == 0 and all(len(top) <= 2 for top in lp.top_logprobs)
    assert all(max(top.values()) == logprob for top, logprob in zip(lp.top_logprobs, lp.token_logprobs, strict=True))


def test_no_logprobs_unless_asked(client) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=RIVERS, max_tokens=4, temperature=0)
    assert answer.choices[0].logprobs is None


@pytest.mark.parametrize(
    "penalties",
    [{"frequency_penalty": 1.5}, {"presence_penalty": 1.5}, {"frequency_penalty": 0.8, "presence_penalty": -0.5}],
)
def test_penalties_change_the_text_as_plain_penalised_decoding_does(client, plain, penalties) -> None:
    unpenalised = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=24, temperature=0)
    answer = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=24, temperature=0, **penalties)
    expected = plain.generate(
        prompt=COUNTING, max_tokens=24, sampling=SamplingConfig(temperature=0, **penalties), reuse_prefix="exact"
    )
    assert answer.choices[0].text == expected.text
    if penalties.get("frequency_penalty", 0) > 1:
        assert answer.choices[0].text != unpenalised.choices[0].text


@pytest.mark.parametrize("repeat", [{"repeat_penalty": 1.6}, {"repeat_penalty": 1.3, "repeat_last_n": -1}])
def test_llamacpps_repeat_penalty_is_plain_repeat_penalised_decoding(client, plain, repeat) -> None:
    # llama-server's field names; the window reaches into the prompt, as llama-server's does.
    unpenalised = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=24, temperature=0)
    answer = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=24, temperature=0, extra_body=repeat)
    expected = plain.generate(
        prompt=COUNTING, max_tokens=24, sampling=SamplingConfig(temperature=0, **repeat), reuse_prefix="exact"
    )
    assert answer.choices[0].text == expected.text != unpenalised.choices[0].text


def test_logit_bias_bans_a_token(client, plain) -> None:
    first = plain.generate(prompt=COUNTING, max_tokens=1, temperature=0, reuse_prefix="exact").tokens[0]
    answer = client.completions.create(
        model=MODEL, prompt=COUNTING, max_tokens=1, temperature=0, logit_bias={str(first): -100}, logprobs=1
    )
    assert answer.choices[0].logprobs.tokens[0] != plain.target.token_bytes(first).decode()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"logit_bias": {"12": 150}}, "logit_bias"),
        ({"logit_bias": {"hello": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"repeat_last_n": -5}, "repeat_last_n"),
    ],
)
def test_bad_values_are_400s_naming_the_field(server, body, param) -> None:
    response = httpx.post(f"{server.url}/chat/completions", json={"messages": RIVERS, **body}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
