"""llama.cpp backend on llama-cpp-python's low-level API.

One reusable llama_batch, logits requested only for the positions that need them, and
rollback with llama_memory_seq_rm. Not the high-level Llama class: it keeps logits for
every position of the context and cannot take a draft model.

A hybrid model (Qwen3.5's Gated DeltaNet layers beside attention) keeps recurrent state,
which cannot be cut at a position, only replaced: RecurrentRollback takes it back.

Its self-drafters are GGUFs derived from the target (copies.py). They cost the kept blocks'
weights once more in memory and a KV cache of their own: llama.cpp has no API to stop a
forward pass early or to share KV across contexts.

The class is assembled from its parts, each a module over the fields state.py declares:
build.py (model, context, batch), text.py (vocabulary), images.py, tree_verify.py (trees)
and hosting.py (the drafters it hosts); evaluation, rollback and closing are here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from localspec.backends.llamacpp import rpc as rpc_entry_points
from localspec.common.gguf_header import (
    check_gguf,
)
from localspec.control.calibrate import pass_seconds, starting_calibration
from localspec.control.contention import busy_cores, default_threads
from localspec.control.hardware import physical_cores
from localspec.core.acceptance import accept_greedy, accept_picks, accept_rejection_sampling
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import (
    Capabilities,
    Logits,
    LogitsMode,
    ModelInfo,
    PassStopped,
)
from localspec.core.records import block_too_long, check_rollback, context_full, outside_vocabulary
from localspec.core.sampling import Distribution, SamplingConfig

from . import compute, drafters, library
from .build import BuildsTarget, check_block_size
from .device_check import CHECKED_ROWS, device_exactness
from .dflash import DFlashDrafter
from .features import HiddenRows
from .gpu import GPU_RESERVE as GPU_RESERVE  # the old import paths, which tests use
from .gpu import GpuDevice as GpuDevice
from .gpu import auto_gpu_layers, gpu_backends, gpu_device, output_on_gpu
from .gpu import gpu_layers_that_fit as gpu_layers_that_fit
from .greedy import DeviceGreedy, rows_aligned
from .head import ContextHead
from .hosting import HostsDrafters
from .images import SeesImages
from .kernels import SPLIT_BLOCKS_UP_TO, kernels_for
from .kernels import buffers_for as buffers_for  # which tooling/peers.py reads through this module
from .lanes import LaneHost, PassShape
from .library import EXACT_BUILD as EXACT_BUILD
from .library import FLASH_ATTN as FLASH_ATTN
from .library import batch_invariant_build as batch_invariant_build
from .library import (
    build_id,
    init_library,
    note_default_kernels,
    use_exact_kernels,
)
from .library import extra_buffers as extra_buffers  # which tooling/peers.py reads through this module
from .library import flash_attention as flash_attention  # which tooling/peers.py reads through this module
from .outputs import LogitsRows
from .recurrent import RECURRENT_SNAPSHOTS, RecurrentRollback
from .text import TargetText
from .tree import BRANCHES
from .tree_verify import VerifiesTrees
from .vision import eval_runs

llama = library.llama  # imported there, with the message that says how to install it


class LlamaCppBackend(BuildsTarget, TargetText, SeesImages, VerifiesTrees, HostsDrafters):
    """One GGUF model with its own context (KV cache) on the CPU. Loaded with lanes=N, its
    context serves N requests in shared passes instead (lane_host(), lanes.py), each lane a
    context of n_ctx."""

    def __init__(
        self,
        path: str,
        n_ctx: int = 4096,
        threads: int | None = None,
        max_block: int = 512,
        rpc: Sequence[str] = (),
        recurrent_snapshots: int = RECURRENT_SNAPSHOTS,
        gpu_layers: int | None = None,
        exact: bool = False,
        lanes: int = 0,
    ) -> None:
        check_gguf(path)
        check_block_size(max_block)
        init_library()
        use_exact_kernels() if exact else note_default_kernels()
        threads = threads or default_threads(physical_cores(), os.cpu_count() or 1, busy_cores())  # contention.py
        # What a derived drafter is loaded with: this machine's options, never the RPC split.
        self._options: dict[str, Any] = {"n_ctx": n_ctx, "threads": threads, "max_block": max_block}
        if gpu_layers is None:  # None: every layer that fits on this build's GPU, if it has one
            gpu_layers = 0 if rpc or exact else auto_gpu_layers(path, gpu_device())
        self._options["gpu_layers"] = gpu_layers
        if exact:
            self._options["exact"] = True
        self._lanes, self._lane_host = lanes, None  # lane_host()
        self._plan = kernels_for(path, exact, bool(rpc) or bool(gpu_layers and gpu_device()), threads)
        self._model = model = self._load_model(path, rpc, gpu_layers, exact)
        self._mtp_layers = int(llama.llama_model_n_layer_nextn(model))
        self._vocab = llama.llama_model_get_vocab(model)
        self._n_vocab = int(llama.llama_vocab_n_tokens(self._vocab))
        stateful = bool(llama.llama_model_is_recurrent(model) or llama.llama_model_is_hybrid(model))
        if stateful:  # a verify block stays one ubatch (see RecurrentRollback)
            self._plan = kernels_for(path, exact, bool(rpc or gpu_layers), threads, stateful=True)
        snapshots = recurrent_snapshots if stateful else None
        self._ctx = ctx = self._make_context(path, model, snapshots)
        self._mem = llama.llama_get_memory(ctx)
        self._logits = LogitsRows(ctx, self._n_vocab)
        on_device = output_on_gpu(gpu_layers, int(llama.llama_model_n_layer(model))) and not lanes  # lanes: host rows
        self._greedy = DeviceGreedy(ctx, wanted=on_device and rows_aligned(self._n_vocab, gpu_backends()))  # greedy.py
        self._picks = False  # set by verify_block around its pass (see eval_block)
        # llama.cpp gives snapshots only to the architectures it lists (0 for the others).
        self._recurrent = RecurrentRollback(ctx, self._mem, int(llama.llama_n_rs_seq(ctx))) if stateful else None
        self._in_flight, self._states = 0, None  # tokens not yet in self._tokens (_unrecorded); MTP's states
        self._captures: dict[tuple[int, ...], HiddenRows] = {}  # layer inputs drafters read (layer_features)
        self._recorded: list[HiddenRows] = []  # both of the above, each added once: the rows eval_block keeps
        self._heads: list[ContextHead | DFlashDrafter] = []  # drafters reading this context, closed before it
        if rpc:
            rpc_entry_points.limit_waits(rpc)
            # The output layer sits on another machine there; its argmax stays the host's (untried).
            self._greedy.wanted = False
        max_block = self._make_batch(ctx, max_block)
        self._tokens: list[int] = []
        # True while the cache may hold positions past self._tokens: an exception (Ctrl+C)
        # that lands after llama_decode filled the cache but before the tokens were recorded.
        self._unrecorded = False
        self._closed = False
        self._pieces: dict[int, bytes] = {}
        self._describe(path, threads, rpc, exact, gpu_layers, max_block)
        self._check_device_kernels()

    def _describe(
        self, path: str, threads: int, rpc: Sequence[str], exact: bool, gpu_layers: int, max_block: int
    ) -> None:
        """info and capabilities: what the model is, and what its cost curve depends on."""
        ctx, model = self._ctx, self._model
        self.info = ModelInfo(
            name=os.path.basename(path),
            path=os.path.abspath(path),
            backend="llamacpp",
            architecture=self._meta("general.architecture") or "unknown",
            n_ctx=int(llama.llama_n_ctx(ctx)),
            n_vocab=self._n_vocab,
            size_bytes=int(llama.llama_model_size(model)),
            n_params=int(llama.llama_model_n_params(model)),
            n_layers=int(llama.llama_model_n_layer(model)),
        )
        extra = {
            "threads": str(threads),
            "file_type": self._meta("general.file_type") or "1",
            "build": build_id(self._plan.repack),
        }
        if rpc:  # the servers are part of the cost curve: another list is another calibration
            extra["rpc"] = ",".join(rpc)
        if self._mtp_layers:
            extra["mtp_layers"] = str(self._mtp_layers)
        if exact:  # other kernels, another cost curve
            extra["exact"] = "1"
        if self._plan.max_rows:  # verify blocks in pieces: another cost curve
            extra["verify_rows"] = str(self._plan.max_rows)
        self._max_rows = self._plan.max_rows or max_block
        device = gpu_device() if gpu_layers and not rpc else None
        if device is not None:  # another device, another cost curve
            # llama.cpp takes a count past the model's (99, -1) as all: the blocks and the output layer.
            layers = self.info.n_layers + 1 if not 0 <= gpu_layers <= self.info.n_layers else gpu_layers
            extra["gpu"] = f"{device.name} ({layers} layers)"
        self.capabilities = Capabilities(
            max_block=max_block,
            device="rpc" if rpc else ("gpu" if device else "cpu"),
            extra=extra,
            verifies=True,  # greedy blocks take their argmax in llama.cpp's graph (greedy.py)
            # recurrent state, or lanes (a sequence each): chains only (tree.py)
            branches=BRANCHES if self._recurrent is None and not self._lanes else 1,
            repasses_branch=True,  # keep_branch
            folds_branch=not self._plan.max_rows,  # keep_branch (split kernels evaluate it at once)
            replays_beyond=self._recurrent.snapshots if self._recurrent is not None else None,
            exactness=self._plan.exactness,  # whether greedy answers are plain decoding's (core.exactness)
        )

    def _check_device_kernels(self) -> None:
        # A device's kernels, checked (device_check.py); with lanes on sequence 0 before any lane
        # runs: the blocks found identical are the most rows a shared pass holds (lane_host).
        if self.capabilities.device == "gpu":
            up_to = min(CHECKED_ROWS, self.capabilities.max_block)
            self.capabilities = replace(
                self.capabilities,
                exactness=device_exactness(self, self.capabilities.extra["gpu"].rsplit(" (", 1)[0], up_to),
            )
            if self._recurrent is not None:
                self._recurrent.forget()

    def lane_host(self, beside: object = None) -> LaneHost:
        """The lanes of a backend loaded with lanes=N, made once: each a Backend of its own
        whose blocks share passes (lanes.py). beside: the target's LaneHost, where this model
        drafts for it (its lanes then take turns with the target's)."""
        self._live()
        if not self._lanes:
            raise InvalidRequestError("this model was loaded for one sequence", "load it with lanes=N")
        if beside is not None and not isinstance(beside, LaneHost):
            raise InvalidRequestError(f"beside must be a LaneHost, got {type(beside).__name__}")
        if self._lane_host is None:
            limit = self.capabilities.exactness.prompt_rows
            rows = self.capabilities.max_block if limit is None else max(limit, 1)
            curve = starting_calibration(self).verify_seconds
            snapshots = self._recurrent.snapshots if self._recurrent is not None else None
            shape = PassShape(rows, partial(pass_seconds, curve), snapshots, self._options["gpu_layers"])
            images = self._images[0] if self._images is not None else None
            self._lane_host = LaneHost(self, self._ctx, self._lanes, shape, beside, images)
        return self._lane_host

    def aborting(self, stop: Callable[[], bool]) -> AbstractContextManager[None]:
        """Abortable: a pass in this block ends with PassStopped once stop() says so (abort.py).
        Not a model with recurrent state: a stopped pass may have changed it already."""
        return self._abort.when(stop) if self._recurrent is None else nullcontext()

    # -- description ------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    # -- text -------------------------------------------------------------------------------

    # -- evaluation -------------------------------------------------------------------------

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        if self._closed:  # checked inline here and in rollback: every call a step makes costs
            self._live()
        if self._deferred:  # a kept branch's tokens go first (keep_branch)
            return self._fold(tokens, logits)
        picks = self._picks  # verify_block's pass: the argmax is taken in the graph, no logits come back
        n = len(tokens)
        if logits == "all" and n > 1 and self._splits(n):  # a verify block, in one-token kernels
            step = self._max_rows
            return np.concatenate([self.eval_block(tokens[i : i + step], "all").copy() for i in range(0, n, step)])
        if n > self.capabilities.max_block:
            raise block_too_long(n, self.capabilities.max_block)
        past = len(self._tokens)
        if past + n > self.info.n_ctx:
            raise context_full(self.info.n_ctx)
        if n == 0:
            return self._no_rows
        if n == 1 and 0 <= tokens[0] < self._n_vocab:  # a plain step: a memoryview's writes cost least
            at = past if self._places is None else self._places.at(past)
            self._tok1[0], self._pos1[0], self._out1[0] = tokens[0], at, logits != "none"
        elif self._images is not None and self._images[0].holds(tokens):  # image positions (vision.py)
            return eval_runs(self._images[0], tokens, logits, self.eval_block, self._eval_image)
        else:
            self._fill(tokens, logits)
        if self._greedy.attached and logits != "none" and not picks:  # this pass's logits are wanted
            self._greedy.detach()
        if self._unrecorded:
            self.rollback(past)
        self._batch.n_tokens = n
        if self._recurrent is not None:
            self._recurrent.before_decode(past, n)
        self._unrecorded, self._in_flight = True, n
        rc = compute.decode(self._ctx, self._batch)
        if rc != 0:
            # A failed or stopped decode leaves the cache as it was before the batch.
            self._unrecorded = False
            if self._abort.stopped(rc):
                raise PassStopped
            raise InvalidRequestError(f"llama_decode failed with code {rc} at position {past}")
        if self._recurrent is not None:
            self._recurrent.after_decode(n)
        for kept in self._recorded:
            kept.record(past, n)
        self._tokens.extend(tokens)
        self._unrecorded = False
        rows = n if logits == "all" else (1 if logits == "last" else 0)
        if rows == 0 or picks:
            return self._no_rows
        return self._logits.rows(rows)

    def _splits(self, n: int) -> bool:
        """Whether a block of n rows with all logits is evaluated in pieces of one-token kernels."""
        return self._max_rows < n <= SPLIT_BLOCKS_UP_TO

    def _fill(self, tokens: Sequence[int], logits: LogitsMode) -> None:
        n = len(tokens)
        self._tok[:n] = tokens
        if int(self._tok[:n].min()) < 0 or int(self._tok[:n].max()) >= self._n_vocab:
            bad = next(int(t) for t in tokens if not 0 <= t < self._n_vocab)
            raise outside_vocabulary(bad, self.info.name, self._n_vocab)
        past = len(self._tokens) if self._places is None else self._places.at(len(self._tokens))
        self._pos[:n] = np.arange(past, past + n)
        self._out[:n] = 0
        if logits == "all":
            self._out[:n] = 1
        elif logits == "last":
            self._out[n - 1] = 1

    def verify_block(
        self,
        tokens: Sequence[int],
        draft_dists: Sequence[Distribution] | None,
        cfg: SamplingConfig,
        rng: np.random.Generator,
    ) -> tuple[int, int]:
        """A greedy block's argmax per row comes from llama.cpp's graph (greedy.py), so no row of
        logits leaves it; where an MTP head reads this context, or when sampling, the host's rule."""
        # A block split into pieces (kernels.py) has its rows over several passes: the host's rule
        # (a one-token pass never splits: no call to ask).
        greedy, n = self._greedy, len(tokens)
        whole = n == 1 or not self._splits(n)
        if cfg.greedy and greedy.wanted and not self._recorded and not self._deferred and whole and greedy.attach():
            # A flag rather than an argument: eval_block stays what wrappers of it expect.
            self._picks = True
            try:
                self.eval_block(tokens, "all")
            finally:
                self._picks = False
            return accept_picks(tokens[1:], greedy.picks(n))
        logits = self.eval_block(tokens, "all")
        if cfg.greedy:
            return accept_greedy(tokens[1:], logits)
        return accept_rejection_sampling(tokens[1:], draft_dists, logits, cfg, rng)

    def _take_deferred(self, n: int) -> list[int]:
        """A kept branch's deferred tokens (keep_branch), out of the record, for a pass of n more
        rows to evaluate first; where they do not fit beside them, evaluated now (none left)."""
        deferred, self._deferred = self._deferred, []
        del self._tokens[len(self._tokens) - len(deferred) :]
        if deferred and (n == 0 or len(deferred) + n > self.capabilities.max_block):
            self.eval_block(deferred, "none")
            return []
        return deferred

    def _fold(self, tokens: Sequence[int], logits: LogitsMode) -> Logits:
        """eval_block with a kept branch's deferred tokens first, in one pass: the rows asked
        for are the caller's tokens' only."""
        prefix = self._take_deferred(len(tokens))
        if not prefix:
            return self.eval_block(tokens, logits)
        rows = self.eval_block([*prefix, *tokens], logits)
        return rows[len(prefix) :] if logits == "all" else rows

    def rollback(self, n: int) -> None:
        if self._closed:
            self._live()
        if n < 0:  # (asked here: check_rollback's call would cost every step)
            check_rollback(n)
        if self._trees is not None and self._trees.open:  # a tree left without keep_branch
            self._trees.abandon()
            n = min(n, len(self._tokens))
        if self._deferred:  # tokens the cache does not hold yet (keep_branch)
            cells = len(self._tokens) - len(self._deferred)
            if n >= cells:  # only the record goes back
                del self._deferred[n - cells :]
                del self._tokens[n:]
                return
            self._deferred = []
        if 0 < n >= len(self._tokens) and not self._unrecorded and self._recurrent is None:
            return  # the cache holds exactly the record (see _unrecorded): nothing to drop
        self._ahead = ()  # an image's rows held past the record (_eval_whole) go with the rest
        if self._recurrent is not None:
            self._rewind(n)
            return
        if self._images is not None and (start := self._images[0].cut_start(self._tokens, n)) is not None:
            return self._cut_image(start, n)
        # Unconditionally: the cache may hold positions the token record does not (see _unrecorded).
        llama.llama_memory_seq_rm(self._mem, 0, n if self._places is None else self._places.at(n), -1)
        del self._tokens[n:]
        self._unrecorded = False
        if self._places is not None:
            self._places.cut(n)

    def _cut_image(self, start: int, n: int) -> None:
        """A rollback into an image whose first rows cannot stay alone (M-RoPE's, sharing one
        position; Gemma 3's, each having read the rest): it goes whole and its first rows are
        decoded again, in the blocks a fresh evaluation cuts them into."""
        kept, step = self._tokens[start:n], self.capabilities.max_block
        self.rollback(start)
        ends = [*range((start // step + 1) * step, n, step), n]
        for a, b in zip([start, *ends[:-1]], ends, strict=True):
            self.eval_block(kept[a - start : b - start], "none")

    def _rewind(self, n: int) -> None:
        assert self._recurrent is not None
        cached = len(self._tokens) + (self._in_flight if self._unrecorded else 0)
        kept = self._tokens[:n]
        self._unrecorded = False
        start = self._recurrent.rewind(min(n, cached), cached)
        if start is not None:  # the state went back further: decode what it lacks again
            del self._tokens[start:]
            if self._places is not None:
                self._places.cut(start)
            step = self.capabilities.max_block
            for at in range(start, len(kept), step):
                self.eval_block(kept[at : at + step], "none")
        del self._tokens[n:]
        if self._places is not None:
            self._places.cut(n)
        self._recurrent.settled()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for head in self._heads:  # their contexts read this model and this context
            head.close()
        if self._lane_host is not None:
            self._lane_host.close()
        if self._images is not None:
            self._images[0].close()
            self._images[1].free()
        llama.llama_batch_free(self._batch)
        if self._trees is not None:
            self._trees.free()
        llama.llama_free(self._ctx)
        self._greedy.free()
        llama.llama_model_free(self._model)

    def __del__(self) -> None:
        if hasattr(self, "_closed"):
            self.close()

    # -- drafters (made in drafters.py from what this target lends them) ------------------------

    def _host(self) -> drafters.Host:
        return drafters.Host(
            target=self,
            model=self._model,
            ctx=self._ctx,
            options=self._options,
            mtp_layers=self._mtp_layers,
            stateful=self._recurrent is not None,
            states=self._target_states,
            load=LlamaCppBackend,
        )


def load(path: str, mmproj: str | None = None, **options: Any) -> LlamaCppBackend:
    backend = LlamaCppBackend(path, **options)
    if mmproj is not None:  # the target's alone: drafters derived from it read text
        backend.see_images(mmproj)
    return backend
