"""Prompt lookup: when the last tokens appeared before, guess that what followed them then
follows them again. Costs no model evaluation; shines when the answer copies its input (code
edits, summaries with quotes, structured output).

Of all earlier occurrences of the last `min_ngram` tokens, the guess copies the one whose
match extends furthest back (the most recent on a tie): a 1-token match picks from many
places, a long match usually finds the very passage being copied. The match length is
returned as the draft's support, which the draft-length policy turns into confidence.

Given a memory of earlier requests, a passage recalled from it is guessed where the request's
own text has no match, or where the passage repeats the text's end at length (a request asked
again): an earlier answer to a like request shares its shape, not its values, so a memory that
outbid the request's own text on any longer match lost to lookup without it
(benchmarks/memory_replay.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.core.sampling import SamplingConfig
from localspec.drafters import Draft, common_prefix
from localspec.drafters.matching import longest_match
from localspec.drafters.memory import KEY, NgramMemory

# How far back a match is measured, and how many earlier occurrences are compared: both
# bound the work per step (a common token like "\n" occurs hundreds of times).
MAX_SUPPORT = 32
CANDIDATES = 64
# A remembered passage that matches the text's end this many tokens back is a repeat (the same
# request again, a regenerated answer) rather than an answer of the same shape.
REPEAT = 16


class NgramDrafter:
    name = "ngram"
    off_notice: str | None = None  # a lookup never switches itself off

    def __init__(
        self,
        min_ngram: int = 1,
        max_support: int = MAX_SUPPORT,
        memory: NgramMemory | None = None,
        recall_greedy_within: int | None = None,
        branching: int = 0,
    ) -> None:
        if min_ngram < 1:
            raise ValueError("min_ngram must be at least 1")
        self.min_ngram = min_ngram
        self.max_support = max(max_support, min_ngram)
        self.memory = memory
        # The context length up to which the target's blocks give one-token passes' logits (None:
        # any): past it a greedy request drafts from its own text only, so its blocks, and so its
        # text, do not depend on what earlier requests said (docs/serve.md, "Repeatable answers").
        self.recall_greedy_within = recall_greedy_within
        # Positions right after every earlier occurrence of each min_ngram-gram, oldest first, in
        # the text indexed so far (_text). Append-only within a request, so a step costs O(new
        # tokens), not O(context); the next request keeps what its prompt shares with this one.
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._text: list[int] = []
        # Index entries added and removed so far: the index's upkeep, which tests count per step.
        self.upkeep = 0
        # For a tree (localspec.core.tree), when above 0: also offer the best-matched earlier
        # continuation that starts with another token (benchmarks/second_candidates.py).
        self.branching = branching

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        # The next turn of a conversation (or a request sharing a system prompt) re-indexes only
        # what differs from the last text, not the whole conversation.
        shared = _shared_prefix(self._text, context)
        if shared < len(self._text) // 2:
            self._index, self._text = {}, []
        else:
            self._forget_from(shared)
        self._extend(context)

    def _extend(self, context: Sequence[int]) -> None:
        # Register the n-gram ending just before every position e < len(context); the current
        # suffix (ending at len-1) is left out so that a lookup never finds itself.
        n, text, index = self.min_ngram, self._text, self._index
        done = len(text)
        text.extend(context[done:])
        for end in range(max(done, n), len(text)):
            index.setdefault(tuple(text[end - n : end]), []).append(end)
        self.upkeep += max(0, len(text) - max(done, n))

    def _forget_from(self, end: int) -> None:
        """Unregister the positions from `end` on, newest first (each key's list is in order)."""
        n, text, index = self.min_ngram, self._text, self._index
        for e in range(len(text) - 1, max(end, n) - 1, -1):
            key = tuple(text[e - n : e])
            found = index[key]
            found.pop()
            if not found:
                del index[key]
        self.upkeep += max(0, len(text) - max(end, n))
        del text[end:]

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        self._extend(context)
        draft = self._copy(context, n)
        within = self.recall_greedy_within
        recall = self.memory is not None and (not cfg.greedy or within is None or len(context) + n < within)
        if recall and self.memory is not None and draft.support < self.max_support:
            # Beside a guess of its own text, only a repeat can win: a match of REPEAT tokens and
            # more than twice as long, so the memory searches for nothing shorter.
            shorter = max(REPEAT, 2 * draft.support + KEY) - 1 if draft.tokens else 0
            recalled = self.memory.recall(context, n, self.max_support, longer_than=shorter)
            repeat = recalled.support + KEY - 1 >= REPEAT and recalled.support > 2 * draft.support
            if recalled.tokens and (not draft.tokens or repeat):
                return recalled
        return draft

    def _copy(self, context: Sequence[int], n: int) -> Draft:
        """The guess from the request's own text."""
        size = len(context)
        if size < self.min_ngram or n <= 0:
            return Draft()
        found = self._index.get(tuple(context[size - self.min_ngram :]))
        if not found:
            return Draft()
        match = longest_match(context, context, found[-CANDIDATES:], self.min_ngram, self.max_support)
        assert match is not None  # every candidate matches its min_ngram tokens
        best, support = match
        tokens = _continuation(context, best, n)
        branches = self._second(context, found, tokens[0], n) if self.branching else None
        return Draft(tokens=tokens, support=support, branches=branches)

    def _support(self, context: Sequence[int], pos: int) -> int:
        """How far back the text before position `pos` matches the text's end."""
        size, m = len(context), self.min_ngram
        while m < self.max_support and pos > m and context[pos - m - 1] == context[size - m - 1]:
            m += 1
        return m

    def _second(
        self, context: Sequence[int], found: list[int], first: int, n: int
    ) -> list[tuple[int, list[int]]] | None:
        """A branch at depth 0: the best-matched earlier continuation (the most recent on a
        tie) whose first token differs from the guess's."""
        best, support = -1, 0
        for pos in reversed(found[-CANDIDATES:]):
            if context[pos] != first and (m := self._support(context, pos)) > support:
                best, support = pos, m
        return [(0, _continuation(context, best, n))] if best >= 0 else None

    def backlog(self, context: Sequence[int]) -> int:
        return 0

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        pass  # the index catches up lazily on the next propose

    def close(self) -> None:
        pass


def _continuation(context: Sequence[int], at: int, n: int) -> list[int]:
    """n tokens copied from position `at` on. A source that runs into the end of the text is
    a repeating pattern ("1212", a loop of lines): the copy goes on through the tokens it has
    just guessed, as an LZ77 copy may overlap its own output. Small models loop so often."""
    tokens = list(context[at : at + n])
    while len(tokens) < n:
        tokens.append(tokens[len(tokens) - (len(context) - at)])
    return tokens


def _shared_prefix(indexed: list[int], context: Sequence[int]) -> int:
    """How many first tokens of `context` the indexed text has: compared as whole lists first,
    in C, since the next turn of a conversation usually extends the last text."""
    n = min(len(indexed), len(context))
    head = list(context[:n])
    return n if head == indexed[:n] else common_prefix(indexed, head)
