"""The lanes' drafters drafting in one pass (`serve --parallel N` with Gemma 4's assistant, a
model's own MTP block, an EAGLE-3 head, or a DFlash or DSpark drafter): each lane's drafter
asks for its pass, and the asks of every lane drafting then go through the drafter's model
together, as llama-server drafts for all its slots at once. One pass a drafted token (a block)
for all lanes, not one for each: a small model's pass costs nearly the same for one row as for
four, and one context's buffers serve every lane.

One context holds a sequence for every lane, each a stream of its own: an assistant's reads the
lane's own stream of the target's KV cache (head.py, head_context), an MTP block's or an
EAGLE-3 head's keeps the lane's cache of it (the head's fc runs as its rows are filled, inside
the pass), a block drafter's the target's features injected at the lane's positions (those
injections run alone, between passes, and each lane's block attends to its own stream). So a
lane's row reads what it reads alone, and a row of a small batch gives the logits it gives
alone (the rows stay within what the CPU kernels keep one-token-exact:
kernels.prompt_block_limit). A pass holds asks whose rows are all outputs, or
asks with none: llama.cpp hands back a pass's first rows where a graph computes every row (the
MTP block's states), so a pass mixing the two would give one lane another's rows. The target's
shared passes and these take turns under the lanes' one lock, and run on the compute thread
(compute.py); a lane's cache cells go (drop) only between passes.

When a pass runs: once every lane inside a request waits for one, here or for the target's next
pass (a lane doing host work is about to ask), or once the oldest ask has waited a straggler's
limit. A lane verifying does not make the target's pass wait for these: a target pass waits
only on the lanes that will join it (lanes.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from localspec.core.errors import BackendClosedError, InvalidRequestError

from . import compute, library
from .head import Entries, PassRows
from .sharing import PassTurns

llama = library.llama
R = TypeVar("R")


class Roster(Protocol):
    """What the lane hosts of a pool share (lanes._Turns): their lock, the lanes inside a
    request, and those whose block waits for a target pass."""

    cond: threading.Condition
    busy: set[int]

    def waiting(self) -> set[int]: ...


@dataclass
class _Ask:
    head: PassRows
    asked: Entries
    since: float
    error: BaseException | None = None
    done: bool = False


@dataclass
class HeadFigures:
    """What the merged passes have run, for the tests and the benchmarks."""

    passes: int = 0
    merged: int = 0  # passes that held more than one lane's rows


class HeadPasses(PassTurns[_Ask]):
    """The passes of every lane's head, in one context (see the module doc)."""

    def __init__(self, ctx: Any, roster: Roster, rows: int) -> None:
        """ctx: the heads' context, one sequence a lane (freed with this); rows: the most a pass
        holds (the context's batch)."""
        super().__init__(roster.cond)
        self.ctx = ctx
        self._roster = roster
        self._rows = max(1, rows)
        self._batch = llama.llama_batch_ext_init(ctx)
        self._closed = False
        self.figures = HeadFigures()

    def run(self, head: PassRows, asked: Entries) -> None:
        """The head's entries in the next merged pass; their outputs read into the head."""
        ask = _Ask(head, asked, time.perf_counter())
        with self._cond:
            if self._closed:
                raise BackendClosedError("the model was closed", "load it again")
            self._await(ask)
        if ask.error is not None:
            raise ask.error

    def _ready(self) -> bool:
        """Whether a pass runs now (the lock held; the module doc says when)."""
        if not self._pending:
            return False
        waiting = self._roster.waiting() | {ask.head.seq for ask in self._pending}
        return self._roster.busy <= waiting or self._oldest_waited()

    def _take(self) -> list[_Ask]:
        """The asks that fit a pass, oldest first, each with outputs as the oldest's (module doc)."""
        asks: list[_Ask] = []
        rows = 0
        outputs = self._pending[0].asked.outputs
        for ask in list(self._pending):
            if ask.asked.outputs != outputs:
                continue
            if asks and rows + len(ask.asked.entries) > self._rows:
                break
            asks.append(ask)
            rows += len(ask.asked.entries)
            self._pending.remove(ask)
        return asks

    def _run(self, asks: list[_Ask]) -> None:
        """One pass over the asks' rows, on the compute thread (sequences in increasing order,
        as llama.cpp takes separate streams together)."""
        asks = sorted(asks, key=lambda ask: ask.head.seq)
        try:
            self._pass(asks)
        except BaseException as exc:  # every ask of the pass ends with it: none has its rows
            for ask in asks:
                ask.error = exc

    def _pass(self, asks: list[_Ask]) -> None:
        llama.llama_batch_ext_clear(self._batch)
        kept, bases, base = [], [], 0
        for ask in asks:
            kept.append(ask.head.fill(self._batch, ask.asked))  # alive until the pass has read them
            bases.append(base)
            base += len(ask.asked.entries)
        rc = compute.process(self.ctx, llama.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise InvalidRequestError(
                f"a drafter's pass for {len(asks)} lanes failed with code {rc}",
                "serve fewer requests at once (--parallel), or draft with --strategy ngram",
            )
        del kept
        self.figures.passes += 1
        self.figures.merged += len(asks) > 1
        for ask, at in zip(asks, bases, strict=True):
            ask.head.read(self.ctx, ask.asked, at)

    def drop(self, head: PassRows, position: int) -> None:
        """The head's cells from position on, removed once no pass is in flight."""
        with self._cond:
            self._settled()
            if not self._closed:
                llama.llama_memory_seq_rm(llama.llama_get_memory(self.ctx), head.seq, position, -1)

    def alone(self, fn: Callable[[], R]) -> R:
        """fn, calls on the context that make no merged pass (a DFlash or DSpark drafter's
        injections and rollbacks), on the compute thread once no pass is in flight; no pass
        starts until it returns."""
        with self._cond:
            self._settled()
            if self._closed:
                raise BackendClosedError("the model was closed", "load it again")
            return self._in_flight(fn)

    def close(self) -> None:
        """Frees the context once no pass is in flight (after the heads that draft in it)."""
        with self._cond:
            self._settled()
            if self._closed:
                return
            self._closed = True
            llama.llama_batch_ext_free(self._batch)
            llama.llama_free(self.ctx)
            self._refuse_waiting(BackendClosedError("the model was closed", "load it again"))
