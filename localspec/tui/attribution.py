"""Which characters of a reply the drafter guessed.

Exact per token, not proportional: every token's bytes go through a UTF-8 decoder of their
own, in order, and each character is credited to the token that completed it. The reply's
text is a prefix of that same decoding (stop strings only ever cut the tail), so character
i of the reply has flag i. A character split across a drafted and a target token counts as
the target's: the drafter did not guess all of it.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class DraftAttribution:
    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._flags: list[bool] = []

    def push(self, tokens: Sequence[int], from_draft: Sequence[bool]) -> None:
        for token, drafted in zip(tokens, from_draft, strict=True):
            chars = self._decoder.decode(self._token_bytes(token))
            self._flags.extend([drafted] * len(chars))

    def spans(self, n_chars: int) -> tuple[tuple[int, int], ...]:
        """Drafted character ranges [start, end) within the first n_chars characters."""
        return flag_spans(self._flags[:n_chars])


def flag_spans(flags: Sequence[bool]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    start: int | None = None
    for i, flag in enumerate(flags):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(flags)))
    return tuple(out)


def drafted_share(spans: Sequence[tuple[int, int]], n_chars: int) -> float:
    return sum(b - a for a, b in spans) / n_chars if n_chars else 0.0
