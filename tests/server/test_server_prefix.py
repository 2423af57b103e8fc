"""A temperature-0 request to `localspec serve` gets the same answer whatever was served
before it. llama.cpp's logits depend on the size of the block each position was evaluated in
(its CPU kernels change at 64 rows), so a follow-up turn reusing the previous answer's cache
(evaluated a few tokens per verify step) can tip a near-tie another way than a fresh
evaluation. By default the server reuses only what a fresh evaluation's own blocks computed;
`cache_prompt: true` (llama-server's name) reuses any cached prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_support import TEST_N_CTX

from localspec.api import Runtime, load
from localspec.server import LocalServer, Settings

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
FIRST = [{"role": "user", "content": "Name three rivers."}]
FOLLOW_UP = "Summarize that in one sentence."
N = 48


def conversation(first_answer: str) -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": first_answer}, {"role": "user", "content": FOLLOW_UP}]


@pytest.fixture(scope="module", params=["none-no-memory", "default"])
def options(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "none-no-memory":
        return {"strategy": "none", "memory": False}
    return {}


@pytest.fixture(scope="module")
def fresh(smollm2_q4_1: Path, options: dict[str, Any]) -> tuple[str, str]:
    """The first answer, and the follow-up's answer evaluated from an empty cache."""
    with load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False, **options) as runtime:
        first = runtime.generate(messages=FIRST, max_tokens=N, temperature=0).text
    with load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False, **options) as runtime:
        return first, runtime.generate(messages=conversation(first), max_tokens=N, temperature=0).text


@pytest.fixture(scope="module")
def client(smollm2_q4_1: Path, options: dict[str, Any]) -> Iterator[openai.OpenAI]:
    def loader(model_id: str) -> Runtime:
        return load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False, **options)

    with LocalServer(loader(MODEL), MODEL, loader, port=0, settings=Settings(log=lambda line: None)) as srv:
        srv.start()
        yield openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)


def answer(client: openai.OpenAI, messages: list[dict[str, str]], **extra: Any) -> str:
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0, **extra)
    return str(reply.choices[0].message.content)


@pytest.mark.parametrize(
    "before",
    [FIRST, [{"role": "user", "content": "What is 12 times 7?"}], None],
    ids=["the-previous-turn", "another-question", "the-same-request"],
)
def test_a_follow_up_gets_the_fresh_answer_whatever_was_served_before_it(client, fresh, before) -> None:
    first, expected = fresh
    if before is not None:
        answer(client, before)
    else:
        answer(client, conversation(first))
    assert answer(client, conversation(first)) == expected


def reply(client: openai.OpenAI, messages: list[dict[str, str]], **extra: Any) -> tuple[str, dict[str, Any]]:
    """The answer and localspec's speculation figures for it."""
    raw = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0, **extra)
    return str(raw.choices[0].message.content), dict(raw.model_extra["speculation"])  # type: ignore[index]


def test_cache_prompt_true_reuses_the_previous_answers_cache_and_says_it_may_part(client, fresh) -> None:
    # The previous answer's cache was evaluated a few tokens a pass; a fresh evaluation takes the
    # follow-up in one block of 64+ tokens, which flash attention's tiled kernel sums in F32 where a
    # one-token pass rounds to F16, on AVX2 and AVX-512 hosts alike (tests/backends/llamacpp/test_host_kinds.py). So
    # the reused answer may tip a near-tie another way (it does on AVX-512 VNNI/BF16 hosts, not on
    # AVX2 ones): what holds everywhere is that the reuse happens, is reproducible, and is said.
    first, expected = fresh
    assert answer(client, FIRST) == first
    reused, figures = reply(client, conversation(first), extra_body={"cache_prompt": True})
    prompt_tokens = figures["prompt_tokens_evaluated"]
    assert figures["fresh_exact"] is False and "flash attention's tiled kernel" in figures["fresh_inexact_reason"]
    assert answer(client, FIRST) == first
    again, figures = reply(client, conversation(first), extra_body={"cache_prompt": True})
    assert again == reused and figures["prompt_tokens_evaluated"] == prompt_tokens
    assert answer(client, FIRST) == first
    again, figures = reply(client, conversation(first))  # a fresh evaluation again
    assert again == expected and figures["fresh_exact"] is None  # nothing reused beyond its own blocks
    assert figures["prompt_tokens_evaluated"] > prompt_tokens  # the reuse did skip work


def test_no_prefix_cache_evaluates_every_prompt_whole_even_when_a_request_asks_to_reuse(
    smollm2_q4_1: Path, options: dict[str, Any], fresh
) -> None:
    # serve --no-prefix-cache: the request above that reused the previous answer's cache and
    # answered otherwise now gets the fresh answer; the whole prompt was evaluated.
    first, expected = fresh

    def loader(model_id: str) -> Runtime:
        return load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, calibrate=False, **options)

    settings = Settings(log=lambda line: None, prefix_cache=False)
    with LocalServer(loader(MODEL), MODEL, loader, port=0, settings=settings) as srv:
        srv.start()
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        assert answer(client, FIRST) == first
        evaluated: list[int] = []
        assert srv.worker.runtime is not None
        target = srv.worker.runtime.target
        rollback = target.rollback
        target.rollback = lambda n: (evaluated.append(n), rollback(n))[1]  # type: ignore[method-assign]
        assert answer(client, conversation(first), extra_body={"cache_prompt": True}) == expected
        assert evaluated[0] == 0  # nothing kept from the previous request
