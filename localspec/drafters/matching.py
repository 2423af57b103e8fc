"""Which earlier occurrence of the text's last tokens matches the text's end furthest back: the
search both n-gram lookup (in the request's own text) and the memory of earlier requests (in
theirs) run once a step, so its cost is a step's host time when the drafter guesses."""

from __future__ import annotations

from collections.abc import Sequence


def longest_match(
    source: Sequence[int], text: Sequence[int], found: Sequence[int], key: int, most: int, longer_than: int = 0
) -> tuple[int, int] | None:
    """Of the positions in `found` (each right after an occurrence in `source` of the text's last
    `key` tokens, oldest first), the one whose occurrence matches the text's end furthest back,
    counted up to `most` tokens (the newest on a tie), with that match's length; None when no
    match is longer than `longer_than` tokens.

    Newest first, a candidate is first compared at the one token it must match to beat the best
    so far (an LZ77 match finder's trick): a candidate that cannot win costs one comparison, not
    its whole match, and a match of `most` tokens ends the search, since none can beat it."""
    size, best, length = len(text), -1, longer_than
    if length >= max(most, key):
        return None
    for pos in reversed(found):
        # A match longer than `length` tokens also matches `length` tokens back (when the key
        # does not already cover them).
        if length >= key and (pos <= length or source[pos - length - 1] != text[size - length - 1]):
            continue
        m = key
        while m < most and pos > m and source[pos - m - 1] == text[size - m - 1]:
            m += 1
        if m > length:
            best, length = pos, m
            if m >= most:
                break
    return (best, length) if best >= 0 else None
