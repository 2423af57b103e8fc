"""The KV caches of the real SmolLM2-135M stay exactly in step with the committed text:
after rejected drafts, across chat turns, after an abandoned stream and under two threads.

On this llama.cpp build (SmolLM2 Q4_1, AVX2 CPU) every block under 64 tokens gives logits
bit-identical to one-token passes, while blocks of 64 or more take another matmul path whose
logits differ by up to ~1.6. A "fresh" evaluation below therefore repeats the engine's own
blocking (the prompt minus its last token in one block, then one token per pass), which
makes the comparison exact instead of loose.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from localspec.api import Completion, TextDelta, runtime_for
from localspec.core.protocol import Backend, LogitsMode

pytestmark = pytest.mark.model

LOGIT_TOLERANCE = 1e-3
GREETING = [{"role": "user", "content": "Tell me about cats."}]


class CountingBackend:
    """A real backend that also records every block it evaluates (a spy, not a mock)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.blocks: list[tuple[int, LogitsMode]] = []

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> npt.NDArray[np.float32]:
        self.blocks.append((len(tokens), logits))
        return self.inner.eval_block(tokens, logits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def n_past(self) -> int:
        return self.inner.n_past


@pytest.fixture(scope="module")
def fresh_target(smollm2_q4_1: Path, load_model: Callable[..., Backend]) -> Backend:
    """A second copy of the target that no Runtime touches: the ground truth."""
    return load_model(smollm2_q4_1)


@pytest.fixture(scope="module")
def fresh_drafter(derived_models: Any, load_model: Callable[..., Backend]) -> Backend:
    return load_model(derived_models["Q4_0"])


def empty_caches(*backends: Backend) -> None:
    for backend in backends:
        backend.rollback(0)


def logits_after(backend: Backend, prefill: Sequence[int], rest: Sequence[int]) -> npt.NDArray[np.float32]:
    """Logits after prefill (one block, from an empty cache) then rest (one token per pass)."""
    backend.rollback(0)
    backend.eval_block(list(prefill), "none")
    row = np.empty(0, dtype=np.float32)
    for token in rest:
        row = backend.eval_block([token], "all")[-1].copy()
    return row


# On a GPU device whose load check found blocks of the verify size parting from one-token
# passes (device_check.py; lavapipe's rows of 5-token blocks by 1.4e-2), cached rows that verify
# blocks computed differ from a fresh evaluation's by that much; a row left from a rejected
# draft would differ by far more.
DEVICE_LOGIT_TOLERANCE = 0.25


def assert_same_next_token_logits(
    cont: npt.NDArray[np.float32], fresh: npt.NDArray[np.float32], backend: Backend, block: int = 6
) -> None:
    rows = backend.capabilities.exactness.rows
    exact_blocks = backend.capabilities.device != "gpu" or rows is None or rows >= block
    assert int(np.argmax(cont)) == int(np.argmax(fresh))
    assert float(np.max(np.abs(cont - fresh))) < (LOGIT_TOLERANCE if exact_blocks else DEVICE_LOGIT_TOLERANCE)


def generate_with_rejections(target: Backend, drafter: Backend) -> tuple[list[int], Completion]:
    empty_caches(target, drafter)
    rt = runtime_for(target, drafter, strategy="draft", draft_tokens=5, calibrate=False)
    out = rt.generate(messages=GREETING, max_tokens=40, temperature=0.8, seed=3)
    assert out.stats.drafted > out.stats.accepted, "no draft was rejected: nothing was rolled back"
    return rt.prompt_tokens(messages=GREETING), out


def committed_cache(backend: Backend, prompt: list[int], out: Completion) -> list[int]:
    """The backend's cache record, checked to be the prompt followed by generated text."""
    cached = list(backend.cached_tokens())
    assert backend.n_past == len(cached)
    text = prompt + out.tokens
    assert len(cached) >= len(prompt) - 1
    overlap = min(len(cached), len(text))
    assert cached[:overlap] == text[:overlap], "the cache holds tokens that were never committed"
    return cached


def test_target_cache_after_rejected_drafts_continues_like_a_fresh_evaluation_of_the_committed_text(
    target_backend: Backend, q4_drafter_backend: Backend, fresh_target: Backend
) -> None:
    prompt, out = generate_with_rejections(target_backend, q4_drafter_backend)
    cached = committed_cache(target_backend, prompt, out)
    probe = target_backend.tokenize(" Also", add_special=False, parse_special=False)[0]

    continued = target_backend.eval_block([probe], "all")[-1].copy()
    fresh = logits_after(fresh_target, prompt[:-1], [*cached[len(prompt) - 1 :], probe])

    assert_same_next_token_logits(continued, fresh, target_backend)


def test_drafter_cache_after_rejected_drafts_continues_like_a_fresh_evaluation_of_the_committed_text(
    target_backend: Backend, q4_drafter_backend: Backend, fresh_drafter: Backend
) -> None:
    prompt, out = generate_with_rejections(target_backend, q4_drafter_backend)
    cached = committed_cache(q4_drafter_backend, prompt, out)
    probe = q4_drafter_backend.tokenize(" Also", add_special=False, parse_special=False)[0]

    continued = q4_drafter_backend.eval_block([probe], "all")[-1].copy()
    fresh = logits_after(fresh_drafter, prompt[:-1], [*cached[len(prompt) - 1 :], probe])

    assert_same_next_token_logits(continued, fresh, q4_drafter_backend)


def test_a_second_chat_turn_evaluates_only_its_new_tokens_in_target_and_drafter(
    target_backend: Backend, q4_drafter_backend: Backend
) -> None:
    drafter = CountingBackend(q4_drafter_backend)
    rt = runtime_for(target_backend, drafter, strategy="draft", draft_tokens=3, calibrate=False)  # type: ignore[arg-type]
    first = rt.generate(messages=GREETING, max_tokens=24, temperature=0)
    turn2 = [*GREETING, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And dogs?"}]
    new_tokens = len(rt.prompt_tokens(messages=turn2)) - first.stats.prompt_tokens
    drafter.blocks.clear()

    second = rt.generate(messages=turn2, max_tokens=8, temperature=0)

    assert second.stats.prefill_tokens <= new_tokens + 1
    assert second.stats.prefill_tokens < second.stats.prompt_tokens / 2
    drafter_prefill = sum(n for n, mode in drafter.blocks if mode == "none")
    assert drafter_prefill <= new_tokens
    assert drafter.n_past == len(drafter.cached_tokens())


def test_an_abandoned_stream_leaves_the_runtime_giving_the_same_greedy_output_as_a_fresh_one(
    target_backend: Backend, q4_drafter_backend: Backend
) -> None:
    empty_caches(target_backend, q4_drafter_backend)
    fresh = runtime_for(target_backend, q4_drafter_backend, strategy="draft", draft_tokens=3, calibrate=False)
    expected = fresh.generate(messages=GREETING, max_tokens=32, temperature=0)
    rt = runtime_for(target_backend, q4_drafter_backend, strategy="draft", draft_tokens=3, calibrate=False)
    stream = rt.stream(messages=GREETING, max_tokens=32, temperature=0)
    events = [next(stream), next(stream)]
    stream.close()

    again = rt.generate(messages=GREETING, max_tokens=32, temperature=0)

    assert all(isinstance(e, TextDelta) for e in events)
    assert again.tokens == expected.tokens
    assert again.text == expected.text


# Short plain prompts: every block the engine evaluates stays under 64 tokens, where all
# block sizes give bit-identical logits, so a reused prefix cannot shift a greedy choice.
THREAD_PROMPTS = ("The capital of France is", "def fibonacci(n):")


def test_two_threads_generating_at_once_both_get_their_serial_greedy_output(
    target_backend: Backend, q8_drafter_backend: Backend
) -> None:
    rt = runtime_for(target_backend, q8_drafter_backend, strategy="draft", draft_tokens=4, calibrate=False)
    serial = {p: rt.generate(p, max_tokens=24, temperature=0).tokens for p in THREAD_PROMPTS}
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(THREAD_PROMPTS))

    def worker(prompt: str) -> None:
        try:
            barrier.wait(timeout=30)
            results[prompt] = rt.generate(prompt, max_tokens=24, temperature=0).tokens
        except BaseException as exc:  # surfaced below, in the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(p,)) for p in THREAD_PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert not errors
    assert not any(t.is_alive() for t in threads)
    assert results == serial


def test_a_prompt_longer_than_one_batch_is_prefilled_in_target_and_drafter(
    target_backend: Backend, q4_drafter_backend: Backend
) -> None:
    rt = runtime_for(target_backend, q4_drafter_backend, strategy="draft", draft_tokens=2, calibrate=False)
    prompt = "one two three four five six seven eight nine ten " * 70
    prompt_tokens = rt.prompt_tokens(prompt)
    assert len(prompt_tokens) > target_backend.capabilities.max_block

    out = rt.generate(prompt, max_tokens=4, temperature=0)

    assert out.stats.generated_tokens == 4
    for backend in (target_backend, q4_drafter_backend):
        assert list(backend.cached_tokens()[: len(prompt_tokens)]) == prompt_tokens
