"""Several requests decoding in one llama.cpp pass (`serve --parallel N`): each request runs in
a lane, a sequence with a KV stream of its own, and the lanes' blocks go through the model
together, so the weights are read once for all of them.

Why a lane's answer is the one it gives alone, bit for bit:
- Each lane has its own stream (kv_unified off). In one shared stream, a lane's rollback frees
  cells among the other lanes' cells and llama.cpp's next placement reuses them, so a lane's
  cells stop being in position order; flash attention sums cells in their order, and a
  near-tie then tips another way than alone.
- A pass holds at most `row_limit` rows in all: the rows that llama.cpp's CPU kernels still
  compute as one-token passes (kernels.prompt_block_limit: 63 on Q4_0/Q4_1/Q8_0, 7 on
  K-quants, 1 on F16); on a GPU, the blocks the load's device check found identical to
  one-token passes (device_check.py; on lavapipe 1 or 2). Within that, a row's logits do not
  depend on the rows beside it.
- With separate streams llama.cpp splits a batch into equal shares per sequence, so every lane
  in a pass brings the same number of rows: a shorter block is padded with rows whose logits
  are not asked for and whose cells are dropped right after the pass.
- A prompt's block longer than the share runs in a pass of its own, the block a lone request
  evaluates, so its cells hold the same values. So does an image's block of embedding rows
  (--mmproj, vision.py), into the lane's sequence: the projector is the model's, shared.
- A model with recurrent state (a hybrid's Gated DeltaNet layers) keeps it per sequence, and a
  lane takes its own back (recurrent.py; llama.cpp keeps snapshots per sequence). Its passes
  share only blocks of one width: padding rows would move a lane's state.

Who runs a pass: the lane thread that finds every busy lane waiting (or the oldest ask waiting
longer than STRAGGLER_SECONDS) takes the asks for all of them, and the pass runs on the pool's
one pass thread (_Turns says why); llama.cpp's calls on one context are never made
concurrently, as a rollback waits for the pass in flight.

A drafter that reads the target's hidden states (the model's MTP head, an EAGLE-3 head, a
DFlash or DSpark drafter) drafts for each lane from the lane's rows, which the host copies out
of every shared pass (llama.cpp hands the last hidden states and the layer inputs out in the
batch's order, padding rows included). Each drafter file, and the model's MTP block, drafts
in one context for every lane's, with as many sequences as the lanes' (an MTP block, an
EAGLE-3 head or a block drafter keeps each lane's cache there; a Gemma 4 assistant reads the
target's KV cache in place, the lane's sequence id mapping to the lane's own stream). The
lanes drafting at once draft in one pass, a token or a block each (head_passes.py). A drafter
file's weights are loaded once for every lane. The drafters' passes run on the compute
thread too, between the shared passes, whatever the threads.

A draft model's lanes (`serve --parallel N --strategy draft`) are a host of their own beside
the target's (`beside=`): lane i of both serves the same request, and the two share one lock
and one roster of busy lanes, so a pass of either runs once every busy lane waits in one of
them (a lane verifying does not hold up the others' drafter passes, nor one drafting their
verify passes). The drafter only proposes, so its lanes need no exactness of their own.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import numpy as np

from localspec.core.errors import BackendClosedError, InvalidRequestError, ModelLoadError, NotSharedError
from localspec.core.protocol import Backend, Logits, LogitsMode

from . import compute, dflash, drafters, eagle3, kernels, library
from .dflash import DFlashDrafter
from .dspark import block_kind, load_block_drafter
from .eagle3 import Eagle3Head
from .features import HiddenRows, TargetShape, check_capture, last_hidden_states, layer_inputs
from .head import DRAFTER_ROWS, ContextHead, LaneSeat, SharedCache, head_context
from .head_passes import HeadPasses
from .lane import Lane, empty_rows
from .mtp import MtpHead
from .outputs import LogitsRows
from .recurrent import RecurrentRollback
from .sharing import PassTurns, gaps_to_fill, next_pass
from .vision import EmbeddingBatch, Projector

llama = library.llama
H = TypeVar("H", bound=ContextHead | DFlashDrafter)
OWN_HEAD = ""  # the model's own MTP block among the heads' merged passes (no file path)
DEFAULT, MTP = llama.LLAMA_CONTEXT_TYPE_DEFAULT, llama.LLAMA_CONTEXT_TYPE_MTP


@dataclass(frozen=True)
class PassShape:
    """How a host's passes are shaped: at most row_limit rows (the rows its kernels keep
    one-token-exact), and cost(rows), the seconds of a pass over that many rows (the calibrated
    curve), which decides whether a narrower block is padded into a wider pass or waits."""

    row_limit: int
    cost: Callable[[int], float]
    snapshots: int | None = None  # a model with recurrent state: its snapshots a decode (recurrent.py)
    gpu_layers: int = 0  # the model's layers on a GPU: its lanes' heads and drafters take as many, as alone


@dataclass
class _Ask:
    """One lane's block waiting for a pass: token ids, or an image's embedding rows recorded as
    its placeholder ids (`embeddings`)."""

    lane: Lane
    tokens: list[int]
    logits: LogitsMode
    since: float
    embeddings: np.ndarray | None = None
    rows: Logits | None = None
    error: BaseException | None = None
    done: bool = False

    @property
    def alone(self) -> bool:
        """Whether it runs in a pass of its own (the module says why)."""
        return self.embeddings is not None


class _Turns:
    """What the lane hosts of one pool share (a target's and its draft model's): one lock, the
    lanes inside a request, by sequence (lane i of every host serves the same request). Every
    pass runs on the process's compute thread (compute.py), not on the lane that led it: passes
    run by whichever lane led kept an OpenMP team per lane thread (on the 2-core EPYC at 2
    threads, 4 clients went from 124 to 143 tok/s, fresh prompts, once they no longer did)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.hosts: list[LaneHost] = []
        self.busy: set[int] = set()

    def waiting(self) -> set[int]:
        """The lanes whose block waits for a pass in any of the hosts (the lock held)."""
        return {ask.lane.seq for host in self.hosts for ask in host._pending}


@dataclass
class _Figures:
    """What the host has run, for /metrics and the tests."""

    passes: int = 0
    shared_passes: int = 0  # passes that held more than one lane
    rows: int = 0
    padded_rows: int = 0
    filled_passes: int = 0  # passes idle lanes joined as padding (LaneHost._fillers)
    widest: int = 0  # the most rows one pass held
    rollbacks: int = 0  # a lane's cells dropped from a position on (a rejected draft's, a new prompt's)


class LaneHost(PassTurns[_Ask]):
    """The lanes of one llama.cpp context made for them (LlamaCppBackend(lanes=N)), and the
    passes that serve them."""

    lanes: list[Lane]
    _turns: _Turns

    def __init__(
        self,
        backend: Backend,
        ctx: Any,
        lanes: int,
        shape: PassShape,
        beside: LaneHost | None = None,
        images: Projector | None = None,
    ) -> None:
        """beside: the target's host, where these are a draft model's lanes (the module says
        why); images: the target's projector, where it reads images (--mmproj)."""
        self.model = backend
        self.cost = shape.cost
        self._ctx, self._mem = ctx, llama.llama_get_memory(ctx)
        self.row_limit = max(1, shape.row_limit)
        # Padding rows would move a lane's recurrent state, which only a snapshot takes back (one
        # a decode, and its own drafts may need it): such a host shares passes between equal blocks.
        self.snapshots, self._gpu_layers = shape.snapshots, shape.gpu_layers
        self._n_vocab = backend.info.n_vocab
        capacity = max(backend.capabilities.max_block, self.row_limit)
        self._batch = llama.llama_batch_init(capacity, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(capacity,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(capacity,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(capacity,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(capacity,))[:] = 1
        self._logits = LogitsRows(ctx, self._n_vocab)
        if images is not None and images.places is not None:  # M-RoPE: a lane's positions would need its own Places
            raise NotSharedError(
                "images on an M-RoPE model (Qwen-VL, Qwen3.5/3.6) are not served in shared passes yet",
                "serve it with --parallel 1",
            )
        if images is not None and images.reads_whole:  # Gemma 3's: an image's rows attend to each other
            raise NotSharedError(
                "images this projector reads whole (Gemma 3's) are not served in shared passes yet",
                "serve it with --parallel 1",
            )
        self.images = images
        self._embeddings = EmbeddingBatch(images.n_embd, capacity) if images is not None else None
        if beside is not None and len(beside.lanes) != lanes:
            raise InvalidRequestError(
                f"a host of {lanes} lanes cannot run beside one of {len(beside.lanes)}", "load both with the same lanes"
            )
        self._turns = beside._turns if beside is not None else _Turns()
        self._turns.hosts.append(self)
        super().__init__(self._turns.cond)
        self._busy = self._turns.busy  # lanes inside a request, shared with the hosts beside
        self._closed = False
        self._heads: list[ContextHead | DFlashDrafter] = []  # the lanes' heads and drafters: their contexts go first
        self._head_models: dict[str, Any] = {}  # a drafter file's weights, by path: one copy for every lane
        self._merged: dict[str, HeadPasses] = {}  # the heads' merged passes: an assistant file's by path, OWN_HEAD
        self.figures = _Figures()
        per_lane = backend.info.n_ctx // lanes
        info = replace(backend.info, n_ctx=per_lane)
        caps = replace(backend.capabilities, verifies=False, branches=1, repasses_branch=False, folds_branch=False)
        self.lanes = [Lane(self, seq, info, caps, self._recurrent_state(seq)) for seq in range(lanes)]

    def _recurrent_state(self, seq: int) -> RecurrentRollback | None:
        return None if self.snapshots is None else RecurrentRollback(self._ctx, self._mem, self.snapshots, seq)

    # -- what a lane asks ---------------------------------------------------------------------

    def evaluate(
        self, lane: Lane, tokens: list[int], logits: LogitsMode, embeddings: np.ndarray | None = None
    ) -> Logits:
        """The block's rows once a pass has taken it (with other lanes' blocks, or alone); an
        image's embeddings, recorded as the placeholder ids `tokens`, go in a pass of their own."""
        ask = _Ask(lane, tokens, logits, time.perf_counter(), embeddings)
        with self._cond:
            self._live()
            self._busy.add(lane.seq)
            self._await(ask)
        if ask.error is not None:
            raise ask.error
        assert ask.rows is not None
        return ask.rows

    def drop(self, lane: Lane, n: int) -> None:
        """The lane's cells from position n on, removed once no pass is in flight."""
        with self._cond:
            self._settled()
            if not self._closed:
                llama.llama_memory_seq_rm(self._mem, lane.seq, n, -1)
                self.figures.rollbacks += 1

    def rewind(self, lane: Lane, n: int) -> int | None:
        """A recurrent lane's state taken back to its first n positions once no pass is in
        flight; from where its tokens must be decoded again (None: nothing to decode)."""
        assert lane.state is not None
        with self._cond:
            self._settled()
            self._live()
            self.figures.rollbacks += 1
            return lane.state.rewind(n, lane.n_past)

    def busy_lanes(self) -> int:
        """The lanes inside a request now (read without the lock: a price, not a decision)."""
        return len(self._busy)

    def passes(self) -> int:
        """The passes run for the lanes so far (read without the lock: a count for /metrics)."""
        return self.figures.passes

    def idle(self, lane: Lane) -> None:
        """The lane's request is over: passes no longer wait for it."""
        with self._cond:
            self._busy.discard(lane.seq)
            self._cond.notify_all()

    # -- heads drafting for a lane (the module doc says how) -------------------------------------

    def mtp_head(self, lane: Lane) -> MtpHead:
        """The model's MTP head drafting for one lane, in one context with a sequence for every
        lane, where the lanes' heads draft in merged passes (head_passes.py); refused, as for a
        lone context, where the model has none."""
        model = llama.llama_get_model(self._ctx)
        layers = int(llama.llama_model_n_layer_nextn(model))
        # A model without a head gets own_mtp_head's refusal, before any context is made for it.
        passes = self._merged_passes(OWN_HEAD, lane, model, self.row_limit) if layers else None
        cache = SharedCache(lane.seq, len(self.lanes), owned=False, passes=passes, reads_target=False)
        states = partial(self._last_states, lane)
        return self._adopt(drafters.own_mtp_head(lane, model, self._ctx, layers, states, cache))

    def assistant_head(self, lane: Lane, path: str) -> MtpHead:
        """A Gemma 4 assistant drafting for one lane: it reads the lane's own stream of the
        shared KV cache in place, in one context with a sequence for every lane, where the
        lanes' assistants draft in merged passes (head_passes.py); the file's weights and that
        context are made once for every lane's."""
        model, layers = llama.llama_get_model(self._ctx), self._gpu_layers
        weights, owned = library.weights_once(
            self._head_models, path, lambda: drafters.load_assistant(lane, model, path, layers)
        )
        passes = self._merged_passes(path, lane, weights, lane.capabilities.max_block)
        cache = SharedCache(lane.seq, len(self.lanes), owned, passes)
        head = drafters.own_assistant(lane, (weights, path), self._ctx, self._last_states(lane), cache)
        return self._adopt(head)

    def _merged_passes(self, key: str, lane: Lane, weights: Any, rows: int, kind: int = MTP) -> HeadPasses:
        """The merged passes of the heads under key (a drafter file's path, or OWN_HEAD): one
        context of type `kind` over `weights` with a sequence for every lane, made on the first
        lane's ask; rows: the most a pass holds."""
        passes = self._merged.get(key)
        if passes is None:
            ctx = head_context(lane, weights, self._ctx, kind, len(self.lanes))
            if not ctx:
                what = os.path.basename(key) if key != OWN_HEAD else f"the MTP head of {lane.info.name}"
                raise ModelLoadError(
                    f"llama.cpp could not open {what} for {len(self.lanes)} lanes",
                    "serve fewer requests at once (--parallel), or draft without it (--strategy ngram)",
                )
            passes = self._merged[key] = HeadPasses(ctx, self._turns, rows)
        return passes

    def _last_states(self, lane: Lane) -> HiddenRows:
        """The target's last hidden states at the lane's positions, which MTP heads read."""
        width = int(llama.llama_model_n_embd_out(llama.llama_get_model(self._ctx)))
        return self._capture(lane, "nextn", lambda: last_hidden_states(self._ctx, lane.info.n_ctx, width))

    def eagle3_head(self, lane: Lane, path: str) -> Eagle3Head:
        """An EAGLE-3 head drafting for one lane, where _seat places it."""
        features = partial(self.layer_features, lane)
        mparams = library.model_params(self._gpu_layers)
        return self._adopt(eagle3.load_eagle3_head(lane, self._ctx, features, mparams, path, self._seat(lane, path)))

    def block_drafter(self, lane: Lane, path: str) -> DFlashDrafter:
        """A DFlash or DSpark drafter drafting blocks for one lane, where _seat places it; a
        drafter whose block outgrows the one context's ubatch (a block stays whole) in a
        context of its own, as alone."""
        seat = self._seat(lane, path, alone=lambda weights: dflash.block_size(weights) > DRAFTER_ROWS)
        return self._adopt(load_block_drafter(lane, self._ctx, path, block_kind(path), self._gpu_layers, seat))

    def _seat(self, lane: Lane, path: str, alone: Callable[[Any], bool] = lambda weights: False) -> LaneSeat:
        """Where a lane's drafter from the file at path sits: in one context with a sequence
        for every lane (its cache a stream of its own), the lanes' rows in merged passes of at
        most a ubatch and the rows the kernels keep one-token-exact; the weights loaded once."""

        def place(weights: Any) -> SharedCache:
            if alone(weights):
                return SharedCache(owned=False)
            rows = min(self.row_limit, kernels.one_token_rows(path, self._gpu_layers > 0), DRAFTER_ROWS)
            passes = self._merged_passes(path, lane, weights, rows, DEFAULT)
            return SharedCache(lane.seq, len(self.lanes), owned=False, passes=passes, reads_target=False)

        return LaneSeat(self._head_models, place)

    def layer_features(self, lane: Lane, ids: Sequence[int], width: int, drafter: str, kind: str) -> HiddenRows:
        """The inputs of layers `ids` at the lane's positions (as LlamaCppBackend.layer_features)."""
        n_embd = int(llama.llama_model_n_embd(llama.llama_get_model(self._ctx)))
        info = lane.info
        check_capture(TargetShape(info.name, info.architecture, info.n_layers, n_embd), drafter, kind, ids, width)
        key = tuple(ids)
        return self._capture(lane, key, lambda: layer_inputs(self._ctx, info.n_ctx, key, n_embd))

    def _capture(self, lane: Lane, key: object, make: Callable[[], HiddenRows]) -> HiddenRows:
        """The lane's rows under key, made where new (once no pass is in flight: a capture turned
        on changes the passes' outputs) and written by every pass from then on. Positions the
        lane decoded before have none: they are decoded again."""
        with self._cond:
            self._settled()
            self._live()
            rows = lane.captures.get(key)
            fresh = rows is None
            if rows is None:
                rows = lane.captures[key] = make()
        if fresh and lane.n_past:
            lane.rollback(0)
        return rows

    def _adopt(self, head: H) -> H:
        self._heads.append(head)  # closed before the model its context reads
        return head

    def close(self) -> None:
        for head in self._heads:  # their contexts read this model, and the heads' own weights
            head.close()
        for passes in self._merged.values():  # the context the lanes' assistants drafted in
            passes.close()
        self._merged.clear()
        for weights in self._head_models.values():
            llama.llama_model_free(weights)
        self._head_models.clear()
        with self._cond:
            self._settled()
            if self._closed:
                return
            self._closed = True
            self._turns.hosts.remove(self)
            llama.llama_batch_free(self._batch)
            if self._embeddings is not None:
                self._embeddings.free()
            self._refuse_waiting(BackendClosedError("the model was closed", "load it again"))

    def _live(self) -> None:
        if self._closed:
            raise BackendClosedError(f"{self.model.info.name} was closed", "load the model again")

    # -- passes (the caller holds the lock) -----------------------------------------------------

    def _ready(self) -> bool:
        """Whether a pass runs now: once every busy lane waits (here or in a host beside), or the
        oldest ask has waited a straggler's limit. (Running for whoever waits, so that host work
        overlaps the pass, was slower: 4 lanes at one thread took 4.5 s where waiting took 3.9 s.)"""
        if not self._pending:
            return False
        return self._busy <= self._turns.waiting() or self._oldest_waited()

    def _take(self) -> list[_Ask]:
        """The next pass's asks (sharing.next_pass), taken out of those waiting."""
        chosen = next_pass(self._pending, self.row_limit, self.cost, equal_only=self.snapshots is not None)
        for ask in chosen:
            self._pending.remove(ask)
        return chosen

    def _run(self, asks: list[_Ask]) -> None:
        # llama.cpp takes sequences of separate streams together only in increasing, consecutive
        # order (split_equal), others in passes of their own: the idle lanes between join as
        # padding where one pass costs less (_fillers).
        asks.sort(key=lambda ask: ask.lane.seq)
        width = max(len(ask.tokens) for ask in asks)
        fillers = [] if asks[0].alone else self._fillers(asks, width)
        # The batch's lanes in sequence order, a filler with no ask: each's rows start at k * width.
        pairs: list[tuple[Lane, _Ask | None]] = [(ask.lane, ask) for ask in asks] + [(lane, None) for lane in fillers]
        members = sorted(pairs, key=lambda m: m[0].seq)
        starts = {lane.seq: k * width for k, (lane, _) in enumerate(members)}
        for ask in asks:
            if ask.lane.state is not None:
                ask.lane.state.before_decode(ask.lane.n_past, len(ask.tokens))
        try:
            rc = self._decode_image(asks[0]) if asks[0].alone else self._decode(members, width)
            if rc != 0:
                raise InvalidRequestError(f"llama_decode failed with code {rc}", "shorten the prompt or the answer")
        except BaseException as exc:
            for ask in asks:
                ask.error = exc
                llama.llama_memory_seq_rm(self._mem, ask.lane.seq, ask.lane.n_past, -1)
            return
        finally:  # a filler's cells go at once: its lane's cache is as it was
            for lane in fillers:
                llama.llama_memory_seq_rm(self._mem, lane.seq, lane.n_past, -1)
        for ask, rows in zip(asks, self._rows(asks), strict=True):
            lane, n = ask.lane, len(ask.tokens)
            for rows_kept in lane.captures.values():  # its head's: the ask's rows, `width` a lane in seq order
                rows_kept.record(lane.n_past, n, starts[lane.seq])
            if n < width:  # the padding's cells go at once: the lane's next block takes their place
                llama.llama_memory_seq_rm(self._mem, lane.seq, lane.n_past + n, -1)
            lane.record(ask.tokens)
            if lane.state is not None:
                lane.state.after_decode(n)
            ask.rows = rows
        figures, lanes = self.figures, len(asks) + len(fillers)
        figures.passes += 1
        figures.shared_passes += len(asks) > 1
        figures.filled_passes += len(fillers) > 0
        figures.rows += width * lanes
        figures.widest = max(figures.widest, width * lanes)
        figures.padded_rows += sum(width - len(ask.tokens) for ask in asks) + width * len(fillers)

    def _fillers(self, asks: list[_Ask], width: int) -> list[Lane]:
        """The idle lanes between the pass's that join it with padding rows (sharing.gaps_to_fill);
        none where padding would move a lane's recurrent state, or a lane has no room for it."""
        if self.snapshots is not None:
            return []
        gaps = [self.lanes[seq] for seq in gaps_to_fill([a.lane.seq for a in asks], width, self.row_limit, self.cost)]
        return gaps if all(lane.n_past + width <= lane.info.n_ctx for lane in gaps) else []

    def _decode(self, members: list[tuple[Lane, _Ask | None]], width: int) -> int:
        self._fill(members, width)
        return compute.decode(self._ctx, self._batch)

    def _decode_image(self, ask: _Ask) -> int:
        """An image's rows at the lane's next positions, in its sequence (vision.py)."""
        assert self._embeddings is not None and ask.embeddings is not None
        past, n = ask.lane.n_past, len(ask.embeddings)
        positions = np.arange(past, past + n, dtype=np.int32)  # lanes take linear projectors only (LaneHost)
        return self._embeddings.decode(self._ctx, ask.embeddings, positions, ask.logits, seq=ask.lane.seq)

    def _rows(self, asks: list[_Ask]) -> list[Logits]:
        """Each ask's logits rows, copied out of the pass's output (in batch order, as
        llama.cpp reorders it): the next pass overwrites them."""
        wanted = [len(a.tokens) if a.logits == "all" else int(a.logits == "last") for a in asks]
        rows = self._logits.rows(sum(wanted)) if sum(wanted) else None
        out, at = [], 0
        for n in wanted:
            out.append(rows[at : at + n].copy() if rows is not None and n else empty_rows(self._n_vocab))
            at += n
        return out

    def _fill(self, members: list[tuple[Lane, _Ask | None]], width: int) -> None:
        """The batch: each ask's tokens and then padding, `width` rows a lane, in sequence order;
        a filler lane's rows all padding, at its next positions, with no output."""
        row, pad = 0, next(ask.tokens[-1] for _, ask in members if ask is not None)
        for lane, ask in members:
            tokens = ask.tokens if ask is not None else [pad]
            n, past, end = len(tokens), lane.n_past, row + width
            self._tok[row : row + n] = tokens
            self._tok[row + n : end] = tokens[-1]
            self._pos[row:end] = np.arange(past, past + width)
            self._out[row:end] = 0
            if ask is not None and ask.logits == "all":
                self._out[row : row + n] = 1
            elif ask is not None and ask.logits == "last":
                self._out[row + n - 1] = 1
            for i in range(row, end):
                self._batch.seq_id[i][0] = lane.seq
            row = end
        self._batch.n_tokens = row
