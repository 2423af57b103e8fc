"""A short prompt reuses the cached rows it shares with earlier requests without parting from
a fresh evaluation (reuse_prefix="exact", serve's default): it goes into llama.cpp as one block
of at most the kernels' prompt_rows (63 on Q4_1), which sums as one-token passes, so every
cached row that one-token passes (or such blocks) computed is the fresh evaluation's, bit for
bit. Rows a larger block computed (a long prompt's 64-row pieces) are not reused by a short
prompt; a long prompt whose rest goes in as a block of 64+ rows reuses them (those kernels give
a row the same bits in any such block: localspec.testing.block_probe checks it per host kind)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.api import Runtime, runtime_for
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend

pytestmark = pytest.mark.model


@pytest.fixture
def fresh_runtime(smollm2_q4_1: Path) -> Iterator[Runtime]:
    backend = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=2048, threads=1)
    with runtime_for(backend, strategy="ngram", calibrate=False) as rt:
        yield rt


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def fresh_answer(target: Backend, messages: list[dict[str, str]]) -> str:
    with runtime_for(target, strategy="none", calibrate=False) as plain:
        return plain.generate(messages=messages, max_tokens=24, temperature=0, reuse_prefix="none").text


def test_a_short_prompt_reuses_one_token_rows_and_answers_as_a_fresh_evaluation(
    fresh_runtime: Runtime, smollm2_q4_1: Path
) -> None:
    rt = fresh_runtime
    first = rt.generate(messages=chat("Name three birds."), max_tokens=24, temperature=0, reuse_prefix="exact")
    second = rt.generate(messages=chat("Name three fish."), max_tokens=24, temperature=0, reuse_prefix="exact")
    stats = second.stats
    assert stats.prompt_tokens <= 63 and first.stats.prompt_tokens <= 63
    # The chat template's prefix (the system turn) came from the cache, and nothing reused may part.
    assert stats.prefill_tokens < stats.prompt_tokens - 10
    assert stats.reused_tokens == 0 and stats.fresh_exact is None  # None: nothing reused that may part
    other = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=2048, threads=1)
    try:
        assert second.text == fresh_answer(other, chat("Name three fish."))
    finally:
        other.close()


def test_rows_a_long_prompts_large_block_computed_are_not_reused_as_exact(fresh_runtime: Runtime) -> None:
    rt = fresh_runtime
    notes = " ".join(f"Note {i}: the ferry leaves pier {i % 7 + 1}." for i in range(40))
    long = rt.generate(messages=chat(notes + " Which pier is busiest?"), max_tokens=4, temperature=0)
    assert long.stats.prompt_tokens > 128  # its prompt went in 64-row pieces and larger
    short = chat("Note 0: the ferry leaves pier 1. Where?")
    exact = rt.generate(messages=short, max_tokens=8, temperature=0, reuse_prefix="exact")
    assert exact.stats.prefill_tokens >= exact.stats.prompt_tokens - 1  # nothing reused: those rows may part
    # The long prompt evaluated afresh again (reuse_prefix "none"), so the rows the short one
    # shares are a 64-row piece's once more.
    rt.generate(messages=chat(notes + " Which pier is busiest?"), max_tokens=4, temperature=0, reuse_prefix="none")
    anyway = rt.generate(messages=short, max_tokens=8, temperature=0, reuse_prefix="any")
    assert anyway.stats.reused_tokens > 0 and anyway.stats.fresh_exact is False
    assert "other blocks" in anyway.stats.fresh_inexact_reason


def test_a_long_prompt_reuses_the_rows_an_earlier_long_prompt_computed_and_answers_as_a_fresh_evaluation(
    fresh_runtime: Runtime, smollm2_q4_1: Path
) -> None:
    rt = fresh_runtime
    shared = " ".join(f"Note {i}: the ferry leaves pier {i % 7 + 1}." for i in range(12))
    first = chat(shared + " " + " ".join(f"Bus {i} stops at gate {i % 5}." for i in range(10)) + " Which pier?")
    second = chat(shared + " " + " ".join(f"Tram {i} waits at stop {i % 3}." for i in range(10)) + " Which gate?")
    rt.generate(messages=first, max_tokens=8, temperature=0, reuse_prefix="exact")
    result = rt.generate(messages=second, max_tokens=24, temperature=0, reuse_prefix="exact")
    stats = result.stats
    # The system turn and the shared notes came from the cache, computed in the first prompt's large block.
    assert stats.prompt_tokens - stats.prefill_tokens > 100
    assert stats.prefill_tokens > 64  # the rest went in as a large block of its own
    assert stats.reused_tokens == 0 and stats.fresh_exact is None  # nothing reused that may part
    other = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=2048, threads=1)
    try:
        assert result.text == fresh_answer(other, second)
    finally:
        other.close()


def test_a_long_prompt_whose_rest_is_short_keeps_only_what_leaves_a_large_block(fresh_runtime: Runtime) -> None:
    rt = fresh_runtime
    shared = " ".join(f"Note {i}: the ferry leaves pier {i % 7 + 1}." for i in range(20))
    rt.generate(messages=chat(shared + " Which pier is first?"), max_tokens=4, temperature=0, reuse_prefix="exact")
    last = chat(shared + " Which pier is last?")
    result = rt.generate(messages=last, max_tokens=4, temperature=0, reuse_prefix="exact")
    # A rest of a few rows would go in a small block, whose kernels part from the fresh large
    # block's: the engine keeps less, so that the rest is 64 rows.
    assert result.stats.prefill_tokens == 64 + 1  # the rest's block, and the prompt's last token
    assert result.stats.reused_tokens == 0
