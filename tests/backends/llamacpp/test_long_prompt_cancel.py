"""A long prompt is cancellable within one piece (issue 56): prefill goes into llama.cpp in
pieces of 64 tokens at first (then as many as take PIECE_SECONDS), a close() from another
thread is seen between two of them, and the pieces give the whole blocks' bits (so the answer
is what it was before pieces)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localspec.api import Finished, runtime_for
from localspec.core.protocol import BLOCK_KERNEL_ROWS, Backend, eval_chunked

pytestmark = pytest.mark.model
BOUND_SECONDS = 300  # a bound, not a timing: 3,000 tokens of prefill on a loaded CI machine
N_CTX = 4096


def long_prompt(backend: Backend, n: int) -> list[int]:
    notes = (f"Note {i}: the ferry leaves pier {i % 12 + 1} with {i * 7} crates." for i in range(400))
    text = " ".join(notes)
    ids = backend.tokenize(text, add_special=True, parse_special=False)[:n]
    assert len(ids) == n
    return ids


@pytest.fixture(scope="module")
def long_backend(load_model: Callable[..., Backend], smollm2_q4_1: Path) -> Backend:
    return load_model(smollm2_q4_1, n_ctx=N_CTX)


class TimedPieces:
    """The prompt pieces a backend is given from now on: their sizes and when each ended."""

    def __init__(self, backend: Backend, after: int) -> None:
        self.sizes: list[int] = []
        self.ended: list[float] = []
        self.in_flight = threading.Event()  # set once `after` pieces are in
        real = backend.eval_block

        def timed(tokens: Sequence[int], logits: Any = "all") -> Any:
            self.sizes.append(len(tokens))
            out = real(tokens, logits)
            self.ended.append(time.perf_counter())
            if len(self.sizes) == after:
                self.in_flight.set()
            return out

        backend.eval_block = timed  # type: ignore[method-assign]
        self._backend, self._real = backend, real

    def restore(self) -> None:
        self._backend.eval_block = self._real  # type: ignore[method-assign]


def test_closing_a_3000_token_prompt_from_another_thread_stops_it_within_one_piece(long_backend: Backend) -> None:
    rt = runtime_for(long_backend, strategy="none", calibrate=False)
    prompt = long_prompt(long_backend, 3000)
    long_backend.rollback(0)
    stream = rt.stream(prompt, max_tokens=8, temperature=0)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(stream))
    pieces = TimedPieces(long_backend, after=3)
    try:
        reader.start()
        assert pieces.in_flight.wait(BOUND_SECONDS)
        asked = time.perf_counter()
        in_at_close = len(pieces.sizes)
        stream.close()
        reader.join(BOUND_SECONDS)
    finally:
        pieces.restore()

    assert not reader.is_alive() and len(got) == 1
    last = got[0]
    assert isinstance(last, Finished) and last.finish_reason == "cancelled" and last.stats.generated_tokens == 0
    assert len(pieces.sizes) - in_at_close <= 1  # the piece in flight, none after it
    assert pieces.sizes[0] == BLOCK_KERNEL_ROWS and all(size % BLOCK_KERNEL_ROWS == 0 for size in pieces.sizes)
    took = pieces.ended[-1] - asked
    piece = float(np.median(np.diff(pieces.ended)))
    print(f"close() to the last piece's end: {took * 1000:.0f} ms; a piece: {piece * 1000:.0f} ms")


@pytest.mark.parametrize("n", [700, 1065])
def test_prefill_in_pieces_gives_the_whole_blocks_bits(long_backend: Backend, n: int) -> None:
    """700: the last block's 187 rows in two pieces (64, 123); 1065: two whole blocks, then a
    block of 40 rows, one piece, as whole blocks end it too."""
    prompt = long_prompt(long_backend, n)
    rows = []
    sizes: list[int] = []
    for pieces in (False, True):
        long_backend.rollback(0)
        if pieces:
            timed = TimedPieces(long_backend, after=0)
            eval_chunked(long_backend, prompt[:-1], "none", stop=lambda: False)
            timed.restore()
            sizes = timed.sizes
        else:
            step = long_backend.capabilities.max_block
            for start in range(0, n - 1, step):
                long_backend.eval_block(prompt[start : min(start + step, n - 1)], "none")
        rows.append(np.array(long_backend.eval_block(prompt[-1:], "last")[-1]))

    assert sizes[0] == BLOCK_KERNEL_ROWS and len(sizes) > (n - 1) // long_backend.capabilities.max_block + 1
    assert np.array_equal(rows[0], rows[1])


def test_a_stop_ends_the_piece_in_flight_and_the_cache_keeps_none_of_it(long_backend: Backend) -> None:
    # llama.cpp asks the stop after every graph node of a prompt piece (abort.py): a stop seen
    # in the middle of the first piece ends it there, the cache keeps none of its tokens, and
    # the model goes on as if the piece had never been asked for.
    prompt = long_prompt(long_backend, 700)
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 40  # once eval_chunked's own check and 39 graph nodes have passed

    long_backend.rollback(0)
    rows = eval_chunked(long_backend, prompt, "last", stop=stop)
    assert rows.shape[0] == 0 and long_backend.n_past == 0
    assert len(asked) == 41  # asked within the pass, not only between pieces
    fresh = eval_chunked(long_backend, prompt, "last")
    long_backend.rollback(0)
    again = eval_chunked(long_backend, prompt, "last")
    assert np.array_equal(fresh, again) and long_backend.n_past == len(prompt)
    # A decoding step is never asked: the callback is there only while the pieces run.
    asked.clear()
    long_backend.eval_block([5], "last")
    assert asked == []
