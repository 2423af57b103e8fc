"""The record of tokens a backend holds: the one check a block passes before it is evaluated
(with one set of messages for every backend), and the record of a drafter that runs inside
its target (an MTP head, an EAGLE-3 head, Gemma 4's assistant), with its one way back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from localspec.core.errors import BackendClosedError, InvalidRequestError
from localspec.core.protocol import Backend, Capabilities, Logits, LogitsMode, ModelInfo, TextFromVocab

LOGITS_MODES = ("all", "last", "none")
State = TypeVar("State")  # a hidden state as the head's framework holds it


def check_open(closed: bool, name: str) -> None:
    """Refuse a call on a closed backend: its model and cache are gone."""
    if closed:
        raise BackendClosedError(f"{name} was closed", "load the model again")


def block_too_long(n: int, max_block: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"a block of {n} tokens exceeds the batch of {max_block}",
        f"evaluate it in blocks of at most {max_block} tokens (core.protocol.eval_chunked)",
    )


def context_full(n_ctx: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"the context of {n_ctx} tokens is full", "roll back first, or load the model with a larger n_ctx"
    )


def outside_vocabulary(token: int, name: str, n_vocab: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"token id {token} is outside {name}'s vocabulary of {n_vocab}",
        "tokenize with the model that evaluates, or use a drafter with the target's tokenizer",
    )


def check_ids(tokens: Sequence[int] | npt.NDArray[np.int64], name: str, n_vocab: int) -> None:
    if len(tokens) == 0:
        return
    ids = np.asarray(tokens, dtype=np.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= n_vocab:
        raise outside_vocabulary(int(ids[(ids < 0) | (ids >= n_vocab)][0]), name, n_vocab)


def check_block(
    tokens: Sequence[int] | npt.NDArray[np.int64], logits: str, info: ModelInfo, capabilities: Capabilities, past: int
) -> None:
    """Refuse a block eval_block cannot take, before anything is evaluated or recorded:
    past is how many tokens the cache holds already."""
    if logits not in LOGITS_MODES:
        raise InvalidRequestError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
    if len(tokens) > capabilities.max_block:
        raise block_too_long(len(tokens), capabilities.max_block)
    if past + len(tokens) > info.n_ctx:
        raise context_full(info.n_ctx)
    check_ids(tokens, info.name, info.n_vocab)


def check_rollback(n: int) -> None:
    if n < 0:
        raise InvalidRequestError(f"rollback needs a token count of 0 or more, got {n}")


class HeadOfTarget(TextFromVocab, Generic[State]):
    """A drafter that runs inside its target (an MTP head): the target's tokenizer is its vocab,
    and it keeps the record of the tokens it holds itself.

    A head reads a token x_q with the state before it: the target's where the target has
    decoded q-1 with the same token, else the head's own (_own), which is how it drafts ahead.
    Positions it read with its own state are in _guessed; once the target has decoded one,
    rollback reads it again with the target's, so the head's cache holds what a clean pass
    would. A subclass sets info, calls __init__ and implements eval_block and _forget."""

    info: ModelInfo
    capabilities: Capabilities
    # True for a head that reads the target's KV cache and keeps none of its own (Gemma 4's
    # assistant): it reads a token only at the target's next position, never below it.
    shared: bool = False

    def __init__(self, target: Backend) -> None:
        self._target = target
        self.vocab = target
        self._tokens: list[int] = []
        self._own: dict[int, State] = {}  # position -> the head's own hidden state there
        self._guessed: set[int] = set()  # positions read with the head's own state
        self._closed = False

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        raise NotImplementedError

    def _forget(self, position: int) -> None:
        """Drop the head's own cache from this position on (a shared head keeps none)."""
        raise NotImplementedError

    def _admit(self, tokens: Sequence[int], logits: str) -> int:
        """Check and record a block of tokens the head is about to read; returns how many it
        held before."""
        check_open(self._closed, self.info.name)
        past = len(self._tokens)
        check_block(tokens, logits, self.info, self.capabilities, past)
        self._tokens.extend(int(t) for t in tokens)
        return past

    def _known(self, position: int) -> bool:
        """Whether the target has decoded this position with the token this head holds there."""
        cached = self._target.cached_tokens()
        return 0 <= position < len(cached) and cached[position] == self._tokens[position]

    def rollback(self, n: int) -> None:
        check_rollback(n)
        kept = self._tokens[:n]
        # Positions read with the head's own state that the target has decoded since are read
        # again with the target's state: from the first of them on (restore, then replay).
        again = len(kept)
        if not self.shared:
            again = next((q for q in sorted(self._guessed) if q < again and self._known(q - 1)), again)
            if again < len(self._tokens):  # its cache holds its record's positions alone: else nothing to drop
                self._forget(again)
        del self._tokens[again:]
        self._guessed = {q for q in self._guessed if q < again}
        self._own = {q: h for q, h in self._own.items() if q < again}
        if again < len(kept):
            self.eval_block(kept[again:], "none")
