"""How well each source of free guesses has guessed, per kind of match: n-gram lookup guesses
from the request's own text and from the memory of earlier requests, and a guess from either is
scored once the text it guessed is known (whether or not a step drafted it), as the run of its
first tokens that came true. A source whose guesses keep failing then loses the step to one
whose guesses hold, whatever their match lengths say: an earlier answer to a like request
repeats the shape (keys, boilerplate) around new values, so the memory matches far back and
still breaks at each value, where the request's own text breaks less often."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.core.protocol import common_prefix

# The match lengths that make a kind of match: 1, 2-3, 4-7, 8-15, 16 and more tokens.
KIND_EDGES = (1, 2, 4, 8, 16)
# Tokens of a guess that are scored: the run that came true, up to this.
SPAN = 8
# Guesses scored before a kind's record decides anything; until then the match lengths do.
EVIDENCE = 6
# Weight of the newest guess in a kind's running mean: about the last 20 guesses count.
WEIGHT = 0.05
# Guesses waiting for their text (one or two a step, settled within SPAN tokens).
PENDING = 4 * SPAN


def kind_of_match(support: int) -> int:
    return sum(1 for edge in KIND_EDGES if support >= edge)


@dataclass
class _Guess:
    source: str
    kind: int
    at: int  # where the guess begins in the context
    tokens: list[int]


class SourceRecords:
    """Per (source, kind of match): the mean run of a guess's first SPAN tokens that came true."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], float] = {}
        self._scored: dict[tuple[str, int], int] = {}
        self._pending: list[_Guess] = []

    def restart(self) -> None:
        """A new request: guesses about the last one's text are dropped; the records stay."""
        self._pending.clear()

    def guessed(self, source: str, support: int, at: int, tokens: Sequence[int]) -> None:
        if tokens:
            self._pending.append(_Guess(source, kind_of_match(support), at, list(tokens[:SPAN])))
            del self._pending[:-PENDING]

    def settle(self, context: Sequence[int]) -> None:
        """Score the guesses whose outcome the context now shows."""
        waiting = []
        for g in self._pending:
            actual = context[g.at : g.at + len(g.tokens)]
            held = common_prefix(g.tokens, actual)
            if held < len(actual) or len(actual) == len(g.tokens):
                self._score((g.source, g.kind), held)
            else:
                waiting.append(g)
        self._pending = waiting

    def score(self, source: str, support: int, held: int) -> None:
        """One guess of this source and match length, of which the first `held` tokens came true."""
        self._score((source, kind_of_match(support)), held)

    def _score(self, key: tuple[str, int], held: int) -> None:
        n = self._scored.get(key, 0)
        mean = self._held.get(key, 0.0)
        # A plain mean until the evidence is in, then a running one (the text changes).
        weight = max(WEIGHT, 1.0 / (n + 1))
        self._held[key] = mean + weight * (held - mean)
        self._scored[key] = n + 1

    def expected_run(self, source: str, support: int) -> float | None:
        """The run of a guess's tokens this source's guesses of this kind held (None: too
        few scored to say)."""
        key = (source, kind_of_match(support))
        return self._held[key] if self._scored.get(key, 0) >= EVIDENCE else None
