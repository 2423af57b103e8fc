"""What earlier requests said: the tokens of past prompts and answers (and, in the chat, of
past conversations), which n-gram lookup searches when the request's own text has no long
match. An app that asks the same kind of question again (the same JSON shape, the same code
boilerplate, a regenerated answer) gets guesses from its earlier answers; llama-lookup's
dynamic cache does this across runs, SuffixDecoding across an agent's calls.

Drafting from it is lossless like any draft: the target verifies every token.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from localspec.drafters import Draft
from localspec.drafters.matching import longest_match

# A recalled passage must match at least this many tokens before the context's end: in a
# large memory a shorter match is a coincidence more often than a copy.
KEY = 4
# Earlier occurrences compared per lookup (the newest), which bounds a step's work.
CANDIDATES = 32
# Past this many tokens the oldest half is forgotten: about 30 MiB of index.
CAPACITY = 200_000
_SEPARATOR = -1  # between documents, so a match never runs from one into another


class NgramMemory:
    """Documents of token ids, indexed by their KEY-grams, searched from any thread."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 2 * KEY:
            raise ValueError(f"capacity must be at least {2 * KEY} tokens")
        self.capacity = capacity
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._last: list[int] = []  # the last document added, to extend rather than repeat it
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, tokens: Sequence[int]) -> None:
        """Remember a document. One that continues the last one (the next turn of the same
        conversation: its prompt holds the last prompt and answer) adds only what is new."""
        tokens = list(tokens)
        with self._lock:
            last = self._last
            if last and tokens[: len(last)] == last:  # compared in C: a conversation is long
                self._append(tokens[len(last) :])
            else:
                if self._tokens:
                    self._append([_SEPARATOR])
                self._append(tokens)
            self._last = tokens
            if len(self._tokens) > self.capacity:
                self._forget_oldest_half()

    def _append(self, tokens: Sequence[int]) -> None:
        start = len(self._tokens)
        self._tokens.extend(tokens)
        # Register the KEY-gram ending just before each new position, as the context index does.
        for end in range(max(start, KEY), len(self._tokens)):
            key = tuple(self._tokens[end - KEY : end])
            if _SEPARATOR not in key:
                self._index.setdefault(key, []).append(end)

    def _forget_oldest_half(self) -> None:
        keep = self._tokens[len(self._tokens) // 2 :]
        cut = keep.index(_SEPARATOR) + 1 if _SEPARATOR in keep else 0  # start at a document
        self._tokens, self._index = [], {}
        self._append(keep[cut:])

    def recall(self, context: Sequence[int], n: int, max_support: int, longer_than: int = 0) -> Draft:
        """Up to n tokens that followed the remembered passage matching the context's end
        furthest back (at least KEY tokens and more than `longer_than`; the newest on a tie),
        with the match's length beyond KEY - 1 tokens as the draft's support."""
        size = len(context)
        if size < KEY or n <= 0:
            return Draft()
        with self._lock:
            found = self._index.get(tuple(context[size - KEY :]))
            if not found:
                return Draft()
            match = longest_match(self._tokens, context, found[-CANDIDATES:], KEY, max_support, longer_than)
            if match is None:
                return Draft()
            best, support = match
            tokens = self._tokens[best : best + n]
        if _SEPARATOR in tokens:
            tokens = tokens[: tokens.index(_SEPARATOR)]
        # Support counts the match beyond the KEY tokens every recalled passage has: the end
        # of a prompt matches every earlier prompt through the chat template's own tokens.
        return Draft(tokens=tokens, support=support - KEY + 1) if tokens else Draft()
