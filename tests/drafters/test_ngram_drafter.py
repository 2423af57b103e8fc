"""Prompt lookup: which earlier passage the n-gram drafter copies, and how far."""

from __future__ import annotations

import numpy as np

from localspec.core.sampling import SamplingConfig
from localspec.drafters.ngram import NgramDrafter

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
