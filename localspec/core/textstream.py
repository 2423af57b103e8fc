"""Turns token bytes into text as it streams: whole UTF-8 characters only, and text that
might be the start of a stop string held back until it is known not to be one."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextAssembler:
    def __init__(self, token_bytes: Callable[[int], bytes], stops: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._held = ""
        self.text = ""  # everything emitted so far
        self.stopped = False

    def push(self, tokens: Sequence[int]) -> str:
        """Add tokens; return the text that is now final. Sets .stopped on a stop string."""
        if self.stopped:
            return ""
        pending = self._held + self._decoder.decode(b"".join(self._token_bytes(t) for t in tokens))
        cut = min((i for i in (pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._held = pending[:cut], ""
        else:
            hold = self._longest_stop_prefix(pending)
            out, self._held = pending[: len(pending) - hold], pending[len(pending) - hold :]
        self.text += out
        return out

    def flush(self) -> str:
        """The text held back. A character whose bytes were cut (by max_tokens, say) is
        dropped: half a character is no text, and U+FFFD in its place would be made up."""
        out = "" if self.stopped else self._held
        self._decoder.reset()
        self._held = ""
        self.text += out
        return out

    def _longest_stop_prefix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
