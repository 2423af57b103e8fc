"""Prompt lookup: when the last tokens appeared before, guess that what followed them then
follows them again. Costs no model evaluation; shines when the answer copies its input (code
edits, summaries with quotes, structured output).

Of all earlier occurrences of the last `min_ngram` tokens, the guess copies the one whose
match extends furthest back (the most recent on a tie): a 1-token match picks from many
places, a long match usually finds the very passage being copied. The match length is
returned as the draft's support, which the draft-length policy turns into confidence.

A copy that breaks on one token (a renamed variable, an edited value) is not given up: the
text after the changed token usually goes on as the source did. The drafter remembers a
proven copy (at least RESYNC_PROVEN matched tokens) whose guess the target rejected, and
offers the source's continuation after the substituted token, for as long as the text keeps
following it, whenever it is backed better than what the suffix lookup finds. That is one
thing llama.cpp's `llama-lookup` cannot do: its n-gram statistics restart after every edit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.drafters import Draft
from localspec.sampling import SamplingConfig

# How far back a match is measured, and how many earlier occurrences are compared: both
# bound the work per step (a common token like "\n" occurs hundreds of times).
MAX_SUPPORT = 32
CANDIDATES = 64
# Support added for each further earlier occurrence that matches as far back and goes on
# the same way, when none goes on otherwise (see _longest_match).
CONSENSUS_BONUS = 1
# A copy must have matched this many tokens before its break to be resumed after it.
RESYNC_PROVEN = 8


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_ngram: int = 1, max_support: int = MAX_SUPPORT) -> None:
        if min_ngram < 1:
            raise ValueError("min_ngram must be at least 1")
        self.min_ngram = min_ngram
        self.max_support = max(max_support, min_ngram)
        # Positions right after every earlier occurrence of each min_ngram-gram, oldest first.
        # Append-only per request, so each step costs O(new tokens), not O(context).
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0
        self._last: _Guess | None = None  # the last guess made, to see how the text went on
        self._resync: _Resync | None = None

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        self._index = {}
        self._indexed = 0
        self._last = self._resync = None
        self._extend(context)

    def _extend(self, context: Sequence[int]) -> None:
        # Register the n-gram ending just before every position e < len(context); the current
        # suffix (ending at len-1) is left out so that a lookup never finds itself.
        n = self.min_ngram
        for end in range(max(self._indexed, n), len(context)):
            self._index.setdefault(tuple(context[end - n : end]), []).append(end)
        self._indexed = max(self._indexed, len(context))

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        self._extend(context)
        size = len(context)
        if size < self.min_ngram or n <= 0:
            return Draft()
        best, support = self._longest_match(context)
        resumed = self._resumed(context)
        if resumed is not None and resumed[1] > support:
            best, support = resumed
        if support == 0:
            self._last = None
            return Draft()
        # A source that runs into the end of the text is a repeating pattern ("1212", a
        # loop of lines): the copy goes on through the tokens it has just guessed, as an
        # LZ77 copy may overlap its own output. Small models fall into such loops often.
        tokens = list(context[best : best + n])
        while len(tokens) < n:
            tokens.append(tokens[len(tokens) - (size - best)])
        self._last = _Guess(size, best, support, tokens)
        return Draft(tokens=tokens, support=support)

    def _longest_match(self, context: Sequence[int]) -> tuple[int, int]:
        """Where the earlier occurrence of the text's end that matches furthest back
        continues, and how far it matches (0: none)."""
        size = len(context)
        found = self._index.get(tuple(context[size - self.min_ngram :]))
        if not found:
            return 0, 0
        best, support, witnesses, dissent = found[-1], 0, 0, False
        for pos in reversed(found[-CANDIDATES:]):
            m = self.min_ngram
            while m < self.max_support and pos > m and context[pos - m - 1] == context[size - m - 1]:
                m += 1
            if m > support:
                best, support, witnesses, dissent = pos, m, 1, False
            elif m == support:
                if context[pos] == context[best]:
                    witnesses += 1
                else:
                    dissent = True
        if CONSENSUS_BONUS and not dissent and support < self.max_support:
            # Every earlier occurrence matching as far back went on the same way: each is a
            # witness (a list's "2. " after "1. ...", a JSON key's closing quote), which a
            # single occurrence of the same length is not.
            support = min(support + CONSENSUS_BONUS * (witnesses - 1), self.max_support)
        return best, support

    def _resumed(self, context: Sequence[int]) -> tuple[int, int] | None:
        """The broken copy's source continued, with its support (the tokens it matched
        before the break plus those since), while the text since the break still follows it."""
        r = self._resync
        if r is None:
            return None
        since = len(context) - r.at
        if since < 0 or list(context[r.at :]) != list(context[r.source : r.source + since]):
            self._resync = None  # the text went its own way
            return None
        return r.source + since, min(r.proven + since, self.max_support)

    def backlog(self, context: Sequence[int]) -> int:
        return 0

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        # The index catches up lazily on the next propose; here the last guess is checked
        # against the text: a proven copy that broke on its last token is remembered.
        last, self._last = self._last, None
        if last is None or len(context) <= last.at:
            return
        new = context[last.at :]
        kept = 0
        while kept < min(len(new), len(last.tokens)) and new[kept] == last.tokens[kept]:
            kept += 1
        if kept == len(new) - 1 and kept < len(last.tokens) and last.support + kept >= RESYNC_PROVEN:
            self._resync = _Resync(at=len(context), source=last.source + kept + 1, proven=last.support + kept)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Guess:
    at: int  # the context length it was made at
    source: int  # where the copied passage starts
    support: int
    tokens: list[int]


@dataclass(frozen=True)
class _Resync:
    """A proven copy broken by one substituted token: the text from `at` on may follow the
    source from `source` on."""

    at: int
    source: int
    proven: int
