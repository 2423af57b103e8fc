"""Rollback for llama.cpp models with recurrent state (hybrid: Qwen3.5's Gated DeltaNet
layers beside attention), which cannot be cut at a position, only replaced."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import llama_cpp as llama

if TYPE_CHECKING:
    from .vision import Places

# Per-token recurrent-state snapshots llama.cpp keeps from each decode of a hybrid model
# (n_rs_seq): up to this many rejected tokens go back with no replay. Every decode pays for
# them, plain steps too (BENCHMARKS.md §7), so they cover the short drafts a hybrid mostly
# gets; a longer rejection takes the state-copy path. Only the drafters that read the target's
# passes load them (Strategy.target_options): n-gram lookup and plain decoding take none.
RECURRENT_SNAPSHOTS = 4


class RecurrentRollback:
    """Rollback for a model whose memory holds recurrent state. Cheapest way first:

    1. llama.cpp's own snapshots of the last decode (n_rs_seq; only the architectures its
       list names get them): a rejected draft inside the last block costs nothing;
    2. a copy of the recurrent state taken where the last rollback left off, restored, and
       the tokens since replayed: what a draft model's token-by-token drafts need, and any
       rollback on a context without snapshots. Copies start once a rollback needed one (at
       once without snapshots), and are taken where a rollback dropped tokens, after a run of
       decodes a later rollback may cross (a drafter's), and before a block longer than the
       snapshots cover. A plain step's rollback drops nothing and takes none: a 1.7 MB copy
       every step cost a small hybrid 6 % of its decoding (benchmarks/pages/serve.md);
    3. a replay from the start (a rollback behind the copy: another request's prefix).

    rewind() says from which position the caller must replay (None: nothing to replay). seq:
    the sequence whose state this is (a lane's, lanes.py; llama.cpp keeps snapshots per sequence)."""

    def __init__(self, ctx: Any, mem: Any, snapshots: int, seq: int = 0) -> None:
        self._ctx, self._mem, self.snapshots, self.seq = ctx, mem, snapshots, seq
        self._last_block = 0  # tokens in the last decode: the snapshots cover these
        self._pending = False  # a snapshot rollback waits for the next decode (one per decode)
        # Rollbacks need copies: take one where each rollback ends. Without snapshots every one
        # does, so from the start: else the first rejection replays the whole context.
        self._copying = snapshots == 0
        self._copy_due = False
        self._arm = False  # whether the rollback in progress makes a copy due (settled)
        self._decodes = 0  # decodes since the last rollback
        self._copy: tuple[int, Any] | None = None  # (record index, the recurrent state there)
        self._spare: Any = None  # a dropped copy's buffer, for the next copy
        # An M-RoPE target's image positions (vision.py): the cache is cut at positions, and
        # no copy is taken inside an image, whose rows share one position (cut only whole).
        self.places: Places | None = None

    def forget(self) -> None:
        """Back to a fresh load's state, the cache empty: a load's own passes (device_check.py)
        say nothing of the rollbacks requests will need."""
        self._last_block, self._pending, self._copy_due, self._copy = 0, False, False, None
        self._copying = self.snapshots == 0

    def before_decode(self, past: int, n: int = 1) -> None:
        """Before a decode of n tokens at position past: the copy, where one is due."""
        due = self._copy_due or n > self.snapshots + 1
        if self._copying and due and (self.places is None or self.places.inside(past) is None):
            flags = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            size = llama.llama_state_seq_get_size_ext(self._ctx, self.seq, flags)
            # The last copy's buffer is written over (this copy replaces it): a new one is zeroed
            # first, which took 1 ms a copy for a 1.7 MB state against 0.1 ms to fill it.
            old = self._copy[1] if self._copy is not None else self._spare
            buf = old if old is not None and len(old) == size else (ctypes.c_uint8 * size)()
            llama.llama_state_seq_get_data_ext(self._ctx, buf, size, self.seq, flags)
            self._copy, self._spare = (past, buf), None
        self._copy_due = False
        self._last_block = 0  # until this decode is known to have finished (after_decode)

    def after_decode(self, n: int) -> None:
        self._last_block, self._pending = n, False
        self._decodes += 1

    def settled(self) -> None:
        """A rollback (and its replay) is done: the next decode starts where drafts start."""
        self._copy_due, self._decodes = self._arm, 0

    def rewind(self, n: int, cached: int) -> int | None:
        """Keep the first n of the `cached` positions the memory holds."""
        drop = cached - n
        self._arm = drop > 0 or self._decodes > 1
        if drop <= 0:
            return None
        places = self.places
        if (
            not self._pending
            and drop <= self.snapshots
            and drop < self._last_block
            and (places is None or places.inside(n) is None)
            and llama.llama_memory_seq_rm(self._mem, self.seq, n if places is None else places.at(n), -1)
        ):
            self._pending = True
            return None
        self._copying = True
        if self._copy is not None and self._copy[0] <= n:
            at, buf = self._copy
            flags = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if llama.llama_state_seq_set_data_ext(self._ctx, buf, len(buf), self.seq, flags) == len(buf):
                cut = at if places is None else places.at(at)
                llama.llama_memory_seq_rm(self._mem, self.seq, cut, -1)  # the attention layers' rows
                self._pending = False
                return at
        self._copy, self._spare = None, self._copy[1] if self._copy is not None else self._spare
        llama.llama_memory_seq_rm(self._mem, self.seq, 0, -1)
        self._pending = False
        return 0
