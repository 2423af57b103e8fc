"""Prompt lookup: when the last few tokens appeared before, guess that what followed them
then follows them again. Costs no model evaluation; shines when the answer copies its input
(code edits, summaries with quotes, structured output)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.drafters import Draft
from localspec.sampling import SamplingConfig


class NgramDrafter:
    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        # index[n][ngram] = position right after the most recent earlier occurrence of ngram.
        # Append-only per request, so each step costs O(new tokens), not O(context).
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed = 0

    def start(self, context: Sequence[int]) -> None:
        self._index = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed = 0
        self._extend(context)

    def _extend(self, context: Sequence[int]) -> None:
        # Register the n-gram ending just before every position e < len(context); the current
        # suffix (ending at len-1) is left out so that a lookup never finds itself.
        for end in range(max(self._indexed, 1), len(context)):
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(context[end - n : end])] = end
        self._indexed = max(self._indexed, len(context))

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        self._extend(context)
        for size in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) < size:
                continue
            pos = self._index[size].get(tuple(context[-size:]))
            if pos is not None:
                return Draft(tokens=list(context[pos : pos + n]))
        return Draft()

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        pass  # the index catches up lazily on the next propose

    def close(self) -> None:
        pass
