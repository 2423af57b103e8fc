"""Turns token bytes into text as it streams: whole UTF-8 characters only, and text that
might be the start of a stop string held back until it is known not to be one."""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Callable, Sequence


class TextAssembler:
    def __init__(self, token_bytes: Callable[[int], bytes], stops: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        # The bytes of a character not yet whole: codecs' incremental UTF-8 decoder's rule,
        # kept here because its Python-level decode() runs once a token (host_time.py).
        self._partial = b""
        self._stops = [s for s in stops if s]
        self._held = ""
        self._parts: list[str] = []  # everything emitted so far, joined when read
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._parts)

    def push(self, tokens: Sequence[int]) -> str:
        """Add tokens; return the text that is now final. Sets .stopped on a stop string."""
        if self.stopped:
            return ""
        data = self._token_bytes(tokens[0]) if len(tokens) == 1 else b"".join(map(self._token_bytes, tokens))
        data = self._partial + data
        decoded, used = utf_8_decode(data, "replace", False)
        self._partial = data[used:]
        if not self._stops:
            self._parts.append(decoded)
            return decoded
        pending = self._held + decoded
        cut = min((i for i in (pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._held = pending[:cut], ""
        else:
            hold = self._longest_stop_prefix(pending)
            out, self._held = pending[: len(pending) - hold], pending[len(pending) - hold :]
        self._parts.append(out)
        return out

    def flush(self) -> str:
        """The text held back. A character whose bytes were cut (by max_tokens, say) is
        dropped: half a character is no text, and U+FFFD in its place would be made up."""
        out = "" if self.stopped else self._held
        self._partial = b""
        self._held = ""
        self._parts.append(out)
        return out

    def _longest_stop_prefix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
