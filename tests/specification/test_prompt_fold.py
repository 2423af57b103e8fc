"""Plain decoding folds the prompt's last token into the prompt's pass, as llama-server does,
so the first token needs no pass of its own; the answer stays the one the unfolded loop gives.

Unfolded, that token opens the first verify block (a pass of one row, where a draft could
ride along). Folded, its row is computed in the prompt's last piece, and only where that
piece still sums as one-token passes (the kernels' prompt_rows: a short prompt, or the new
part of a conversation), so the row's bits are the one-row pass's. n-gram lookup folds too
where its policy declines the first guess. The unfolded loop here is n-gram lookup held at
draft length 0 under a policy that says it would draft the first guess, so it keeps the
separate pass. The AVX2 kernels run this file too (.ci/run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from localspec.api import Runtime, runtime_for
from localspec.core.protocol import BLOCK_KERNEL_ROWS, Backend, Logits, eval_chunked
from localspec.testing.policies import DraftsFirstGuess

pytestmark = pytest.mark.model

PROMPTS = [
    "Write a short poem about rain.",
    # Over prompt_rows tokens: its piece would not sum as one-token passes, so it is not folded.
    "Summarize in one sentence: The city council met on Tuesday to discuss the new park. Residents asked "
    "for more trees, a playground, benches along the river, and lights on the path; the council agreed to "
    "fund the trees and the playground next year and to look at the rest in the spring.",
]


class Passes:
    """Counts the target's passes (eval_block calls) while installed."""

    def __init__(self, target: Backend) -> None:
        self.target, self.rows = target, list[int]()
        self._own = target.eval_block

    def __enter__(self) -> Passes:
        def counted(tokens: Any, logits: Any = "all") -> Logits:
            self.rows.append(len(tokens))
            return self._own(tokens, logits)

        self.target.eval_block = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.target.eval_block


@pytest.fixture(scope="module")
def runtimes(target_backend: Backend) -> tuple[Runtime, Runtime]:
    """Not closed: closing a runtime closes its target, the session's."""
    unfolded = runtime_for(target_backend, strategy="ngram", policy=DraftsFirstGuess(0))
    return runtime_for(target_backend, strategy="none"), unfolded


def _answer(rt: Runtime, prompt: str, **knobs: Any) -> tuple[list[int], list[float], list[int]]:
    """Tokens, their logprobs and the rows of each pass, for a fresh evaluation of the prompt."""
    with Passes(rt.target) as passes:
        done = rt.generate(
            messages=[{"role": "user", "content": prompt}], max_tokens=24, logprobs=True, reuse_prefix="none", **knobs
        )
    assert done.logprobs is not None
    return [t.token for t in done.logprobs], [t.logprob for t in done.logprobs], passes.rows


@pytest.mark.parametrize("knobs", [{"temperature": 0}, {"temperature": 0.9, "seed": 11}], ids=["greedy", "seeded"])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["short", "long"])
def test_plain_decoding_takes_its_first_token_from_a_short_prompts_pass_with_the_same_bits(
    runtimes: tuple[Runtime, Runtime], prompt: str, knobs: dict[str, Any]
) -> None:
    folded, unfolded = runtimes
    tokens, logprobs, rows = _answer(folded, prompt, **knobs)
    tokens_u, logprobs_u, rows_u = _answer(unfolded, prompt, **knobs)
    assert tokens == tokens_u and len(tokens) >= 16
    assert logprobs == logprobs_u  # bit for bit: the first token's row is the one-row pass's
    # One prompt piece either way (the CPU's first piece takes up to 127 rows), then one-row passes.
    assert rows[1:] == [1] * (len(rows) - 1) and rows_u[1:] == [1] * (len(rows_u) - 1)
    limit = folded.target.capabilities.exactness.prompt_rows
    assert limit is not None
    if rows_u[0] < limit:  # folded: the prompt's last token in its piece, one pass fewer
        assert rows[0] == rows_u[0] + 1 and len(rows) == len(rows_u) - 1
    else:  # the piece with it would not sum as one-token passes: the first token has its own pass
        assert rows == rows_u
    assert (rows_u[0] < limit) == (prompt is PROMPTS[0])


def test_n_gram_folds_where_its_policy_declines_the_first_guess_and_not_where_it_drafts(
    runtimes: tuple[Runtime, Runtime],
) -> None:
    """The default strategy's first guess is backed by the prompt alone, which the adaptive
    policy declines: its first token comes from the prompt's pass, as plain decoding's, with
    plain decoding's answer. A fixed draft length drafts that guess, in the first step's pass."""
    plain, unfolded = runtimes
    target = plain.target
    adaptive = runtime_for(target, strategy="ngram")
    drafting = runtime_for(target, strategy="ngram", draft_tokens=4, calibrate=False)
    prompt = "Repeat after me: the quick brown fox jumps over the lazy dog."
    tokens, logprobs, rows = _answer(plain, prompt, temperature=0)
    tokens_a, logprobs_a, rows_a = _answer(adaptive, prompt, temperature=0)
    assert tokens_a == tokens and logprobs_a == logprobs
    assert rows_a[0] == rows[0]  # the prompt's last token in the prompt's piece
    _, _, rows_u = _answer(unfolded, prompt, temperature=0)
    assert rows_u[0] == rows[0] - 1 and rows_u[1] == 1
    tokens_d, _, rows_d = _answer(drafting, prompt, temperature=0)
    assert tokens_d == tokens
    assert rows_d[0] == rows[0] - 1 and rows_d[1] > 1  # the first step's pass holds a draft


def test_eval_chunked_folds_a_token_only_into_a_piece_that_sums_as_one_token_passes(target_backend: Backend) -> None:
    """eval_chunked's tail: its row equals the one-row pass's where the last piece with it
    fits the kernels' prompt_rows; where it would not, nothing is folded and no rows come back."""
    limit = target_backend.capabilities.exactness.prompt_rows
    assert limit is not None and limit < BLOCK_KERNEL_ROWS
    prompt = [int(t) for t in np.random.default_rng(3).integers(200, 20000, size=2 * BLOCK_KERNEL_ROWS)]
    stop: Callable[[], bool] = lambda: False  # noqa: E731 - a stop makes the CPU's 64-row pieces

    for n in (0, 10, limit - 1):
        target_backend.rollback(0)
        eval_chunked(target_backend, prompt[:n], "none", stop)
        expected = target_backend.eval_block([prompt[n]], "last")[-1].copy()
        target_backend.rollback(0)
        rows = eval_chunked(target_backend, prompt[:n], "none", stop, prompt[n], limit)
        assert len(rows) == 1 and np.array_equal(rows[-1], expected), n
        assert target_backend.n_past == n + 1
    for n in (limit, BLOCK_KERNEL_ROWS + 5):  # one piece of limit + 1 rows, or of 70
        target_backend.rollback(0)
        rows = eval_chunked(target_backend, prompt[:n], "none", stop, prompt[n], limit)
        assert len(rows) == 0 and target_backend.n_past == n, n
    target_backend.rollback(0)
