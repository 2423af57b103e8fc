"""A drafter head in a llama.cpp context of its own beside its target's (ctx_other): the passes
that a model's MTP head (mtp.py) and an EAGLE-3 head (eagle3.py) share.

Each reads a token x_q with a state before it: the target's where the target has decoded
q-1 (HeadOfTarget), else the head's own output there, set as the token's embedding of a
batch; each output's state (llama.cpp's nextn embeddings) is kept for the positions after it.
The heads differ in where a state comes from (_states_for) and how a token's cache position
follows from its own (shift).

On a prompt holding an image (vision.py) a head reads every position, the image's too, at
the target's own positions: there the state it reads is the target's (decoded from the
image's rows, so the image reaches the head through it), and the token is a fixed stand-in
(IMAGE_STAND_IN), since a head embeds token ids and an image position has none. Any stand-in
keeps the output exact (the target verifies every guess); it only shapes acceptance.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import llama_cpp as llama
import numpy as np
from llama_cpp import llama_cpp_ext as ext

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend, Logits, LogitsMode
from localspec.core.records import HeadOfTarget

from . import compute
from .features import HiddenRows

R = TypeVar("R")

# The token a head reads at an image position (see the module doc): llama.cpp's draft-simple
# feeds a draft model zeros there; a head's graph takes token ids, so a fixed one it is.
IMAGE_STAND_IN = 0

# The rows a drafter's context beside its target computes at once (its ubatch). llama.cpp
# reserves buffers for a ubatch's logits over the whole vocabulary: at the target's 512 rows a
# head took 68 MiB on a 32k vocabulary (about 500 MiB on Qwen3.5's 248k), for every lane, where
# its passes are a few rows a step; a prompt's catch-up runs in ubatches of this many instead.
DRAFTER_ROWS = 64


def head_context(target: Backend, model: Any, target_ctx: Any, ctx_type: int, streams: int = 1) -> Any:
    """A context for a drafter that reads its target's context (ctx_other), as large as the
    target's; NULL when llama.cpp cannot make it. streams: the target context's sequences, each
    a stream of its own (lanes.py), where the drafter reads the target's KV cache in place
    (Gemma 4's assistant): llama.cpp maps a sequence to its stream by the reading context's."""
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = target.info.n_ctx * streams
    cparams.n_seq_max = streams
    cparams.kv_unified = False
    cparams.n_batch = target.capabilities.max_block
    cparams.n_ubatch = min(target.capabilities.max_block, DRAFTER_ROWS)
    threads = int(target.capabilities.extra.get("threads", "1"))
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.ctx_type = ctx_type
    cparams.ctx_other = target_ctx
    return llama.llama_init_from_model(model, cparams)


@dataclass(frozen=True)
class Entries:
    """A head's pass: (position, token, output?) entries; `at`, the position a shared-cache head
    writes every token to; `into`, the rows its logits go to; outputs: every row an output."""

    entries: list[tuple[int, int, bool]]
    at: int | None
    into: dict[int, np.ndarray]
    outputs: bool


class PassRows(Protocol):
    """A lane's drafter in a merged pass (head_passes.py): a ContextHead, or a block drafter
    (dflash.py): its sequence, its entries put into a pass's batch, its outputs read back."""

    seq: int

    def fill(self, batch: Any, asked: Entries) -> list[np.ndarray]:
        """The entries' rows added to batch; what they point at, alive until the pass has run."""
        ...

    def read(self, ctx: Any, asked: Entries, base: int) -> None:
        """The entries' outputs out of ctx's last pass, where their rows began at index base."""
        ...


class MergedPasses(Protocol):
    """Where a lane's drafter runs its passes together with the other lanes' (head_passes.py)."""

    ctx: Any

    def run(self, drafter: PassRows, asked: Entries) -> None:
        """The drafter's entries, in a pass shared with the other lanes' asks; their outputs read."""
        ...

    def drop(self, drafter: PassRows, position: int) -> None:
        """The drafter's cache cells from position on, removed once no pass is in flight."""
        ...

    def alone(self, fn: Callable[[], R]) -> R:
        """fn, calls on the context that make no merged pass (a block drafter's injections),
        run on the compute thread once no pass is in flight; no pass starts until it returns."""
        ...


@dataclass(frozen=True)
class SharedCache:
    """Where a head sits in a context of several sequences: sequence `seq` of `streams`, each a
    stream of its own (a lane's, lanes.py; 0 of 1 for a lone target); owned: its model is freed
    with it (False: one copy of the weights serves every lane's); passes: the lanes' merged
    passes, whose context it drafts in (None: a context of its own); reads_target: it reads its
    target's KV cache in place (Gemma 4's assistant) rather than keeping a cache of its own (a
    model's MTP block)."""

    seq: int = 0
    streams: int = 1
    owned: bool = True
    passes: MergedPasses | None = None
    reads_target: bool = True


@dataclass(frozen=True)
class LaneSeat:
    """Where a lane's head from a file sits in a pool (lanes.py): models, the weights the host
    keeps by file and frees itself (one copy for every lane's); place, its sequence in the
    lanes' one context for those weights (made on the first lane's ask)."""

    models: dict[str, Any]
    place: Callable[[Any], SharedCache]


class ContextHead(HeadOfTarget[np.ndarray]):
    """A head drafting in a llama.cpp context beside its target's (see the module doc). A
    subclass sets info and capabilities and says which state each position is read with."""

    # Whether the head's graph computes its output for every token of a pass, so that a pass
    # costs the same whichever rows are outputs (EAGLE-3's; see _pass).
    every_row = False
    # Image positions are read at the target's positions (module doc): ModelDrafter passes
    # a prompt's image ids through rather than leaving them out of the head's view.
    reads_image_positions = True

    def __init__(
        self,
        target: Backend,
        ctx: Any,
        states: HiddenRows,
        width: int,
        model: Any = None,
        cache: SharedCache | None = None,
    ) -> None:
        """ctx: the head's context (a merged one's, where cache.passes has one); states: the
        target's rows it reads; width: its states'; model: a file's own model, freed with the
        context (None: the target's own blocks); cache: where it reads a lanes' target cache in
        place (mtp.py): its passes go to cache.seq, and with cache.passes beside the other lanes'."""
        super().__init__(target)
        self.merged = cache.passes if cache is not None else None
        self._states, self._model = states, model
        self._ctx, self._mem = ctx, llama.llama_get_memory(ctx)
        self.shift = 0  # a token at position q is read at the head's cache position q - shift
        self.seq = cache.seq if cache is not None else 0
        ext.llama_set_embeddings_nextn(ctx, True, True)  # a row for each output only
        self._batch = llama.llama_batch_ext_init(ctx)
        self._width = width
        self._vocab = target.info.n_vocab
        self._rows = int(llama.llama_n_ubatch(ctx))  # the most outputs a pass asks for (DRAFTER_ROWS)

    def _admit(self, tokens: Sequence[int], logits: str) -> int:
        """As HeadOfTarget's, an image's ids checked as their stand-in and recorded as they are
        (so that _known matches them against the target's record)."""
        past = super()._admit([t if t >= 0 else IMAGE_STAND_IN for t in tokens], logits)
        self._tokens[past:] = [int(t) for t in tokens]
        return past

    def _states_for(self, qs: list[int]) -> list[tuple[np.ndarray, bool]]:
        """The state each of these positions is read with, and whether it is the target's."""
        raise NotImplementedError

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        n, past = len(tokens), self._admit(tokens, logits)
        if n == 0:
            return np.empty((0, self._vocab), dtype=np.float32)
        frontier = len(self._target.cached_tokens())  # beyond it, drafts need the head's own states
        picked = range(n) if logits == "all" else ([n - 1] if logits == "last" else [])
        out = np.empty((len(picked), self._vocab), dtype=np.float32)
        into = {past + k: out[row] for row, k in enumerate(picked)}  # logits go straight there
        try:
            if self.shared:
                for k, token in enumerate(tokens):
                    if past + k >= frontier or past + k in into:  # the target's cache holds the others
                        self._pass([(past + k, int(token), True)], min(past + k, frontier), into)
            else:
                wanted = [past + k in into or past + k >= frontier for k in range(n)]
                self._pass([(past + k, int(t), wanted[k]) for k, t in enumerate(tokens)], None, into)
        except InvalidRequestError:
            self._forget(past)  # whatever a failed pass left: the cache holds the record's positions alone
            del self._tokens[past:]
            raise
        return out

    def _pass(self, entries: list[tuple[int, int, bool]], at: int | None, into: dict[int, np.ndarray]) -> None:
        """One pass over (position, token, output?) entries, each read with the state before it;
        `at`: the position a shared-cache head writes every token to (its target's next one).
        Keeps the outputs' states, and writes their logits into the rows `into` holds for them.

        llama.cpp hands back a pass's first rows where a graph computes them for every token
        (Qwen3.5's MTP states, EAGLE-3's logits), whichever rows were flagged; so every row of
        a pass is an output, or none is. The outputs are always the last entries (the tokens
        the target has not decoded, or the one asked for): the rest go in a pass of their own,
        unless the graph computes every row anyway (every_row). Outputs go a ubatch at a time,
        so llama.cpp's output buffer holds no more rows than its compute buffer (DRAFTER_ROWS)."""
        split = 0 if self.every_row else next((i for i, (_, _, out) in enumerate(entries) if out), len(entries))
        if split:
            self._run(Entries(entries[:split], at, into, outputs=False))
        for start in range(split, len(entries), self._rows):
            self._run(Entries(entries[start : start + self._rows], at, into, outputs=True))

    def _run(self, asked: Entries) -> None:
        """One llama.cpp pass over the entries, every row an output or none (see _pass); a
        lanes' assistant's in a pass with the other lanes' (head_passes.py)."""
        if self.merged is not None:
            self.merged.run(self, asked)
            return
        llama.llama_batch_ext_clear(self._batch)
        kept = self.fill(self._batch, asked)  # the states the batch points at, alive until the pass has run
        rc = compute.process(self._ctx, llama.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        del kept
        if rc != 0:
            at = asked.entries[0][0]
            raise InvalidRequestError(f"{self.info.name}'s pass failed with code {rc} at position {at}")
        self.read(self._ctx, asked, 0)

    def fill(self, batch: Any, asked: Entries) -> list[np.ndarray]:
        """The entries' rows added to batch, in this head's sequence; the states they embed,
        which must live until the pass has read them."""
        states: list[np.ndarray] = []
        read = self._states_for([q for q, _, _ in asked.entries])
        for (q, token, _), (state, exact) in zip(asked.entries, read, strict=True):
            idx = llama.llama_batch_ext_add_token(batch, self.seq, token if token >= 0 else IMAGE_STAND_IN)
            position = llama.llama_pos(q - self.shift if asked.at is None else asked.at)
            llama.llama_batch_ext_set_pos(batch, idx, ctypes.byref(position))
            states.append(np.ascontiguousarray(state, dtype=np.float32))
            embd = llama.llama_embd(states[-1].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self._width)
            llama.llama_batch_ext_set_embd_token(batch, idx, embd)
            (self._guessed.discard if exact else self._guessed.add)(q)
            llama.llama_batch_ext_set_output_logits(batch, idx, asked.outputs)
        return states

    def read(self, ctx: Any, asked: Entries, base: int) -> None:
        """The entries' outputs out of ctx's last pass, where their rows began at index base:
        each output's state kept, its logits written where asked.into holds a row for them."""
        for k, (q, _, output) in enumerate(asked.entries):  # both calls take the token's index in the batch
            if output:
                state_ptr = ext.llama_get_embeddings_nextn_ith(ctx, base + k)
                self._own[q] = np.ctypeslib.as_array(state_ptr, shape=(self._width,)).copy()
            if q in asked.into:
                logits = llama.llama_get_logits_ith(ctx, base + k)
                asked.into[q][:] = np.ctypeslib.as_array(logits, shape=(self._vocab,))

    def _forget(self, position: int) -> None:
        if self.merged is not None:  # another lane's pass may be running in that context
            self.merged.drop(self, max(position - self.shift, 0))
            return
        llama.llama_memory_seq_rm(self._mem, self.seq, max(position - self.shift, 0), -1)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        llama.llama_batch_ext_free(self._batch)
        if self.merged is None:  # else the lanes' merged passes own it
            llama.llama_free(self._ctx)
        if self._model is not None:
            llama.llama_model_free(self._model)
