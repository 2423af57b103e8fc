"""Prompt lookup: which earlier passage the n-gram drafter copies, and how far."""

from __future__ import annotations

import numpy as np

from localspec.drafters.ngram import NgramDrafter
from localspec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


def guess(context: list[int], n: int) -> tuple[list[int], int]:
    drafter = NgramDrafter()
    drafter.start(context)
    draft = drafter.propose(context, n, GREEDY, np.random.default_rng(0))
    return draft.tokens, draft.support


def test_the_passage_matching_furthest_back_is_copied() -> None:
    # "7" occurs twice before the end; only the first occurrence is preceded by "3 4" too.
    context = [3, 4, 7, 8, 9, 5, 7, 6, 6, 3, 4, 7]
    assert guess(context, 3) == ([8, 9, 5], 3)


def test_on_a_tie_the_most_recent_passage_is_copied() -> None:
    assert guess([1, 7, 2, 1, 7, 3, 9, 7], 1) == ([3], 1)


def test_a_repeating_pattern_is_continued_past_the_end_of_the_text() -> None:
    # The best source starts two tokens before the end: the copy runs through its own guesses.
    tokens, support = guess([9, 1, 2, 1, 2, 1, 2], 5)
    assert tokens == [1, 2, 1, 2, 1] and support == 4
    assert guess([4, 0, 0, 0], 6)[0] == [0] * 6  # a run of one token


def test_text_never_seen_before_gets_no_guess() -> None:
    assert guess([1, 2, 3, 4], 4) == ([], 0)
    assert guess([5], 4) == ([], 0)


def test_a_proven_copy_broken_by_one_changed_token_is_resumed_after_it() -> None:
    # The text copies a 12-token passage, but with its 13th token changed (a renamed name):
    # the source's continuation after the changed token is offered, backed by the copy.
    source = [20 + i for i in range(30)]
    context = [*source, 1, *source[:12]]
    drafter = NgramDrafter()
    drafter.start(context)
    draft = drafter.propose(context, 4, GREEDY, np.random.default_rng(0))
    assert draft.tokens == source[12:16]
    context.append(99)  # the target wrote 99 where the copy said source[12]
    drafter.commit(context, 0)
    resumed = drafter.propose(context, 4, GREEDY, np.random.default_rng(0))
    assert resumed.tokens == source[13:17] and resumed.support >= 12
    context.extend(source[13:15])  # the text follows the source again: still resumed
    drafter.commit(context, 2)
    assert drafter.propose(context, 2, GREEDY, np.random.default_rng(0)).tokens == source[15:17]


def test_a_weak_guess_that_breaks_is_not_resumed() -> None:
    context = [5, 6, 7, 8, 1, 5, 6]
    drafter = NgramDrafter()
    drafter.start(context)
    assert drafter.propose(context, 2, GREEDY, np.random.default_rng(0)).tokens == [7, 8]
    context.append(42)
    drafter.commit(context, 0)
    assert drafter.propose(context, 2, GREEDY, np.random.default_rng(0)).tokens == []


def test_a_resumed_copy_keeps_greedy_output_identical_to_plain_decoding() -> None:
    # The reference model's greedy path after (a, b) is fixed; the prompt holds that path
    # with its 12th token changed, then (a, b) again. The copy of the prompt's passage breaks
    # at the changed token and is resumed after it: what comes out is still plain decoding.
    from localspec.backends.reference import BOS, ReferenceBackend
    from localspec.controller import FixedDraftLength
    from localspec.engine import Engine
    from localspec.stats import Stats

    def model() -> ReferenceBackend:
        return ReferenceBackend(vocab_size=64, seed=0)

    def plain(prompt: list[int], n: int) -> list[int]:
        context = list(prompt)
        for _ in range(n):
            context.append(int(np.argmax(model().exact_probs(context, GREEDY))))
        return context[len(prompt) :]

    start = [BOS, 5, 9]
    path = plain(start, 30)
    changed = [*path[:11], (path[11] + 1) % 60 + 3, *path[12:]]
    prompt = [*start, *changed, 7, 5, 9]
    drafter = NgramDrafter()
    resumed: list[object] = []
    real = drafter._resumed

    def spy(context: list[int]) -> tuple[int, int] | None:
        hit = real(context)
        resumed.append(hit)
        return hit

    drafter._resumed = spy  # type: ignore[method-assign]
    stats = Stats()
    engine = Engine(model(), drafter, free_drafter=True)
    rng = np.random.default_rng(0)
    out = [t for step in engine.generate(prompt, 24, GREEDY, FixedDraftLength(4), stats, rng) for t in step.tokens]
    assert out == plain(prompt, 24)
    assert any(hit is not None for hit in resumed) and stats.accepted > 12
