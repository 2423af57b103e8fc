"""llama.cpp backend on llama-cpp-python's low-level API.

One reusable llama_batch, logits requested only for the positions that need them, and
rollback with llama_memory_seq_rm. Not the high-level Llama class: it keeps logits for
every position of the context and cannot take a draft model.

A hybrid model (Qwen3.5's Gated DeltaNet layers beside attention) keeps recurrent state,
which cannot be cut at a position, only replaced: RecurrentRollback takes it back.

Its self-drafters are GGUFs derived from the target (copies.py). They cost the kept blocks'
weights once more in memory and a KV cache of their own: llama.cpp has no API to stop a
forward pass early or to share KV across contexts.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from localspec.backends.llamacpp import rpc as rpc_entry_points
from localspec.control.calibrate import pass_seconds, starting_calibration
from localspec.control.contention import busy_cores, default_threads
from localspec.control.hardware import physical_cores
from localspec.core.acceptance import accept_greedy, accept_picks, accept_rejection_sampling
from localspec.core.errors import BackendClosedError, InvalidRequestError, ModelLoadError
from localspec.core.gguf_header import (
    ASSISTANT_ARCHITECTURE,
    assistant_alone,
    check_gguf,
    diagnose_gguf,
    load_failure_hint,
    read_header,
)
from localspec.core.protocol import (
    Backend,
    Capabilities,
    Logits,
    LogitsMode,
    ModelInfo,
    PassStopped,
    VocabIdentity,
)
from localspec.core.records import block_too_long, check_rollback, context_full, outside_vocabulary
from localspec.core.sampling import Distribution, SamplingConfig
from localspec.core.tree import depths
from localspec.drafters import cannot_attach

from . import drafters, library
from .abort import Abort
from .device_check import CHECKED_ROWS, device_exactness
from .dflash import DFlashDrafter
from .dspark import DSparkDrafter
from .eagle3 import Eagle3Head
from .features import HiddenRows, TargetShape, check_capture, last_hidden_states, layer_inputs
from .gpu import GPU_RESERVE as GPU_RESERVE  # the old import paths, which tests use
from .gpu import GpuDevice as GpuDevice
from .gpu import auto_gpu_layers, gpu_backends, gpu_device, output_on_gpu
from .gpu import gpu_layers_that_fit as gpu_layers_that_fit
from .greedy import DeviceGreedy, rows_aligned
from .head import ContextHead
from .kernels import SPLIT_BLOCKS_UP_TO, kernels_for
from .lanes import LaneHost
from .library import EXACT_BUILD as EXACT_BUILD
from .library import FLASH_ATTN as FLASH_ATTN
from .library import batch_invariant_build as batch_invariant_build
from .library import (
    build_id,
    flash_attention,
    init_library,
    note_default_kernels,
    use_exact_kernels,
)
from .library import extra_buffers as extra_buffers  # which tooling/peers.py reads through this module
from .mtp import MtpHead
from .outputs import LogitsRows
from .recurrent import RECURRENT_SNAPSHOTS, RecurrentRollback
from .tree import BRANCHES, TreePass
from .vision import EmbeddingBatch, Projector, eval_runs

llama = library.llama  # imported there, with the message that says how to install it

H = TypeVar("H", bound=ContextHead | DFlashDrafter)  # a drafter reading this target's context


def _model_params(rpc: Sequence[str], gpu_layers: int) -> tuple[Any, Any]:
    """Model parameters: gpu_layers layers on this machine's GPU and the rest on its CPU, or
    every layer on the given RPC servers' devices (returned too: the array must outlive the load)."""
    mparams = library.model_params(gpu_layers)
    if not rpc:
        return mparams, None

    return mparams, rpc_entry_points.offload_to_servers(mparams, rpc)


# llama.cpp pads every context to a multiple of 256 cells. Asked for fewer than BRANCHES it
# also caps its batch there, below the one output per sequence it reserves: GGML_ASSERT.
MIN_CONTEXT = 256


def context_cells(n_ctx: int, n_ctx_train: int) -> int:
    """The context asked of llama.cpp: n_ctx, at most what the model was trained on (memory for
    a context it cannot use), at least MIN_CONTEXT (the smallest llama.cpp makes anyway)."""
    return max(min(n_ctx, n_ctx_train or n_ctx), MIN_CONTEXT)


def check_block_size(max_block: object) -> None:
    """Refuse a batch that llama.cpp would abort the process on: each of the tree's BRANCHES
    sequences reserves an output row in it."""
    if isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < BRANCHES:
        raise InvalidRequestError(
            f"max_block (llama.cpp's batch) must be a whole number of {BRANCHES} or more, got {max_block!r}",
            "leave max_block out (512, the default)",
        )


class LlamaCppBackend:
    """One GGUF model with its own context (KV cache) on the CPU. Loaded with lanes=N, its
    context serves N requests in shared passes instead (lane_host(), lanes.py), each lane a
    context of n_ctx."""

    _lane_host: LaneHost | None  # made by lane_host(), once
    _images: tuple[Projector, EmbeddingBatch] | None = None  # see_images(): a projector and its batch

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
        self._plan = kernels_for(path, exact, bool(rpc or gpu_layers), threads)
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
        on_device = on_device and rows_aligned(self._n_vocab, gpu_backends())  # greedy.py
        self._greedy = DeviceGreedy(ctx, wanted=on_device)
        self._picks = False  # set by verify_block around its pass (see eval_block)
        # llama.cpp gives snapshots only to the architectures it lists (0 for the others).
        self._recurrent = RecurrentRollback(ctx, self._mem, int(llama.llama_n_rs_seq(ctx))) if stateful else None
        self._in_flight = 0  # tokens of a decode not yet in self._tokens (see _unrecorded)
        self._states: HiddenRows | None = None  # hidden states an MTP head reads (mtp_head)
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

    def see_images(self, mmproj: str) -> None:
        """Read images through the projector GGUF mmproj (vision.py); a projector that fails to
        load closes this backend: nothing stays loaded half-way."""
        try:
            if self._lanes:  # a lane's blocks go through lanes.py, which reads token ids only
                raise InvalidRequestError("images are not served in shared passes yet", "serve it with --parallel 1")
            projector = Projector(mmproj, self._model, self._options["threads"], bool(self._options["gpu_layers"]))
        except BaseException:
            self.close()
            raise
        self._images = projector, EmbeddingBatch(projector.n_embd, self.capabilities.max_block)

    def _load_model(self, path: str, rpc: Sequence[str], gpu_layers: int, exact: bool) -> Any:
        mparams, self._devices = _model_params(rpc, gpu_layers)
        mparams.use_extra_bufts = self._plan.repack  # repacked K-quants take another kernel for 4+ rows
        # A model's own MTP blocks (Qwen3.5's nextn layers, one block) are loaded whenever the
        # file has them: a drafting context on a model loaded without them aborts the process.
        mparams.load_mtp = True
        model = llama.llama_model_load_from_file(os.fsencode(path), mparams)
        if not model:
            raise ModelLoadError(
                f"llama.cpp could not load {path}: {diagnose_gguf(path)}",
                load_failure_hint(path),
            )
        arch = ctypes.create_string_buffer(64)
        llama.llama_model_meta_val_str(model, b"general.architecture", arch, len(arch))
        if arch.value == ASSISTANT_ARCHITECTURE.encode():  # drafts only, from inside its target
            llama.llama_model_free(model)
            raise assistant_alone(path)
        return model

    def _make_context(self, path: str, model: Any, snapshots: int | None) -> Any:
        """The model's context, as the load options ask; snapshots: recurrent-state snapshots per
        decode (None: not a recurrent model)."""
        options = self._options
        threads, max_block, exact = options["threads"], options["max_block"], bool(options.get("exact"))
        n_ctx = context_cells(options["n_ctx"], int(llama.llama_model_n_ctx_train(model))) * max(self._lanes, 1)
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = max_block
        cparams.n_ubatch = max_block
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # Rollback of a rejected draft needs the whole sliding-window cache (Gemma 3's, say):
        # a pruned window cannot give back the tokens it dropped.
        cparams.swa_full = True
        cparams.n_outputs_max_per_seq = 0  # as many as the batch: greedy.py takes a verify block's argmax
        # Exact: flash attention on the CPU splits a one-token pass over the KV cache once it
        # holds 512 cells (one partial sum per thread), which a block never does.
        cparams.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED if exact else flash_attention()
        # One stream for every sequence: a tree's branches share the cells of the text before
        # it (tree.py); with a single sequence this is the cache it always was.
        cparams.kv_unified = snapshots is None
        cparams.n_seq_max = BRANCHES if snapshots is None else 1
        if self._lanes:  # a stream per lane (lanes.py says why)
            cparams.kv_unified, cparams.n_seq_max = False, self._lanes
        if snapshots is not None and self._lanes:
            llama.llama_model_free(model)
            raise InvalidRequestError(
                f"{os.path.basename(path)} keeps recurrent state, which shared passes do not serve yet",
                "serve it with --parallel 1",
            )
        if snapshots is not None:
            cparams.n_rs_seq = snapshots
            # The snapshots come from the last ubatch: a verify block must fit in one.
            cparams.n_ubatch = max(cparams.n_ubatch, snapshots + 1)
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            llama.llama_model_free(model)
            raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for {path}")
        self._abort = Abort(ctx)  # ends a prompt's piece in flight (abort.py)
        return ctx

    def _make_batch(self, ctx: Any, max_block: int) -> int:
        """The one reusable batch, with numpy views over its arrays; returns the block size it takes."""
        # llama.cpp caps the batch at a small requested n_ctx (then pads n_ctx): a block
        # larger than its batch would abort the process, so take its figure as ours.
        max_block = min(max_block, int(llama.llama_n_batch(ctx)))
        self._batch = llama.llama_batch_init(max_block, 0, 1)
        # numpy views over the batch's C arrays: filling a block is a few vector writes.
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(max_block,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(max_block,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(max_block,))
        # The same arrays as memoryviews, for a plain step's three writes: numpy's item writes
        # touch more code, which costs after a pass has emptied the caches (host_time.py).
        self._tok1, self._pos1 = self._tok.data.cast("B").cast("i"), self._pos.data.cast("B").cast("i")
        self._out1 = self._out.data.cast("B").cast("b")
        # What a pass that brings no rows back returns: one empty array, never written.
        self._no_rows = np.empty((0, self._n_vocab), dtype=np.float32)
        self._no_rows.flags.writeable = False
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(max_block,))[:] = 1
        for i in range(max_block):
            self._batch.seq_id[i][0] = 0
        # Trees (tree.py) where the cache is cells; a recurrent state per sequence takes none.
        self._trees = None if self._recurrent is not None or self._lanes else TreePass(ctx, self._mem, max_block)
        # The end of self._tokens that the cache does not hold yet: a kept branch's tokens that
        # the next pass evaluates first (keep_branch folds its second pass into the next).
        self._deferred: list[int] = []
        return max_block

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
        extra = {"threads": str(threads), "file_type": self._meta("general.file_type") or "1", "build": build_id()}
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
        if self.capabilities.device == "gpu" and not self._lanes:  # a device's kernels, checked (device_check.py)
            up_to = min(CHECKED_ROWS, self.capabilities.max_block)
            self.capabilities = replace(
                self.capabilities,
                exactness=device_exactness(self, self.capabilities.extra["gpu"].rsplit(" (", 1)[0], up_to),
            )
            if self._recurrent is not None:
                self._recurrent.forget()

    def lane_host(self) -> LaneHost:
        """The lanes of a backend loaded with lanes=N, made once: each a Backend of its own
        whose blocks share passes (lanes.py)."""
        self._live()
        if not self._lanes:
            raise InvalidRequestError("this model was loaded for one sequence", "load it with lanes=N")
        if self._lane_host is None:
            limit = self.capabilities.exactness.prompt_rows
            rows = self.capabilities.max_block if limit is None else max(limit, 1)
            curve = starting_calibration(self).verify_seconds
            self._lane_host = LaneHost(self, self._ctx, self._lanes, rows, partial(pass_seconds, curve))
        return self._lane_host

    def aborting(self, stop: Callable[[], bool]) -> AbstractContextManager[None]:
        """Abortable: a pass in this block ends with PassStopped once stop() says so (abort.py).
        Not a model with recurrent state: a stopped pass may have changed it already."""
        return self._abort.when(stop) if self._recurrent is None else nullcontext()

    def _live(self) -> None:
        # Every call reaches into freed C memory once closed: refuse it instead of crashing.
        if self._closed:
            raise BackendClosedError(f"{self.info.name} was closed", "load the model again")

    # -- description ------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):  # chat templates can be long: ask again with room for all of it
            buf = ctypes.create_string_buffer(n + 1)
            llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def vocab_identity(self) -> VocabIdentity:
        self._live()
        texts = tuple((llama.llama_vocab_get_text(self._vocab, i) or b"") for i in range(self._n_vocab))
        bos = int(llama.llama_vocab_bos(self._vocab))
        eos = int(llama.llama_vocab_eos(self._vocab))
        kinds = {1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
        kind = kinds.get(int(llama.llama_vocab_type(self._vocab)), "none")
        return VocabIdentity(kind, self._n_vocab, bos if bos >= 0 else None, eos if eos >= 0 else None, texts)

    def end_of_generation(self) -> frozenset[int]:
        self._live()
        return self._eog()

    @cache  # noqa: B019 - one backend per model, lives as long as the model
    def _eog(self) -> frozenset[int]:
        return frozenset(i for i in range(self._n_vocab) if llama.llama_vocab_is_eog(self._vocab, i))

    def chat_template(self) -> str | None:
        self._live()
        return self._meta("tokenizer.chat_template")

    def special_texts(self) -> dict[str, str]:
        self._live()
        out = {}
        for name, tok in (
            ("bos_token", llama.llama_vocab_bos(self._vocab)),
            ("eos_token", llama.llama_vocab_eos(self._vocab)),
        ):
            out[name] = (llama.llama_vocab_get_text(self._vocab, tok) or b"").decode() if tok >= 0 else ""
        return out

    # -- text -------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self._live()
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (llama.llama_token * cap)()
        n = llama.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama.llama_token * cap)()
            n = llama.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)  # a vocabulary does not change: each piece is asked for once
        if piece is None:
            self._live()
            piece = self._pieces[token] = self._piece(token)
        return piece

    def _piece(self, token: int) -> bytes:
        # A buffer per call: lanes (lanes.py) read pieces from several threads at once.
        buf = ctypes.create_string_buffer(256)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

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
            self._tok1[0], self._pos1[0], self._out1[0] = tokens[0], past, logits != "none"
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
            self._recurrent.before_decode(past)
        self._unrecorded, self._in_flight = True, n
        rc = llama.llama_decode(self._ctx, self._batch)
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

    def _eval_image(self, rows: np.ndarray, ids: list[int], logits: LogitsMode) -> Logits:
        """One pass over an image's rows (embeddings) at the next positions, recorded as its
        placeholder ids (vision.py)."""
        assert self._images is not None
        past, n = len(self._tokens), len(ids)
        if self._greedy.attached and logits != "none":
            self._greedy.detach()
        if self._unrecorded:
            self.rollback(past)
        if self._recurrent is not None:
            self._recurrent.before_decode(past)
        self._unrecorded, self._in_flight = True, n
        if (rc := self._images[1].decode(self._ctx, rows, past, logits == "last", logits == "all")) != 0:
            self._unrecorded = False
            if self._abort.stopped(rc):
                raise PassStopped
            raise InvalidRequestError(f"llama_decode failed with code {rc} on an image at position {past}")
        if self._recurrent is not None:
            self._recurrent.after_decode(n)
        for kept in self._recorded:
            kept.record(past, n)
        self._tokens.extend(ids)
        self._unrecorded = False
        return self._no_rows if logits == "none" else self._logits.rows(n if logits == "all" else 1)

    def image_marker(self) -> str | None:
        """localspec.core.media.SeesImages: the text that stands for an image in a prompt
        given to tokenize_images; None: loaded without a projector (--mmproj)."""
        return self._images[0].marker if self._images is not None else None

    def tokenize_images(self, text: str, images: Sequence[bytes], names: Sequence[str]) -> list[int]:
        """The ids of a rendered prompt holding image_marker() once per image: each image's
        positions as placeholder ids (vision.py)."""
        self._live()
        if self._images is None:
            raise InvalidRequestError(f"{self.info.name} was loaded without a projector", "load it with --mmproj FILE")
        return self._images[0].tokenize(text, images, names)

    def _splits(self, n: int) -> bool:
        """Whether a block of n rows with all logits is evaluated in pieces of one-token kernels."""
        return self._max_rows < n <= SPLIT_BLOCKS_UP_TO

    def _fill(self, tokens: Sequence[int], logits: LogitsMode) -> None:
        n = len(tokens)
        self._tok[:n] = tokens
        if int(self._tok[:n].min()) < 0 or int(self._tok[:n].max()) >= self._n_vocab:
            bad = next(int(t) for t in tokens if not 0 <= t < self._n_vocab)
            raise outside_vocabulary(bad, self.info.name, self._n_vocab)
        past = len(self._tokens)
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

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> Logits:
        """localspec.core.protocol.TreeBackend: one pass, every branch a sequence (tree.py)."""
        self._live()
        trees, n, past = self._trees, len(tokens), len(self._tokens)
        if trees is None:
            raise InvalidRequestError(f"{self.info.name} verifies chains only", "draft without branches")
        self._check_tree(tokens, parents)
        if self._greedy.attached:  # this pass's logits are wanted
            self._greedy.detach()
        if self._unrecorded:
            self.rollback(past)
        prefix = self._take_deferred(n)  # a kept branch's tokens (keep_branch): the tree's trunk
        if prefix:
            k = len(prefix)
            tokens = [*prefix, *tokens]
            parents = [*range(-1, k - 1), *(p + k if p >= 0 else k - 1 for p in parents)]
            n, past = len(tokens), len(self._tokens)
        trees.trunk = len(prefix)
        depth = depths(parents)
        trees.begin(past, parents)
        self._unrecorded, self._in_flight = True, n
        step = self._max_rows if self._splits(n) else n  # exact kernels: in pieces, as eval_block
        rows = []
        for start in range(0, n, step):
            part = range(start, min(n, start + step))
            if (rc := trees.decode(tokens, [past + d for d in depth], part)) != 0:
                self.rollback(past)
                raise InvalidRequestError(
                    f"llama_decode failed with code {rc} at position {past}", "draft without branches"
                )
            for kept in self._recorded:  # node rows at past + node until keep_branch gathers the path's
                kept.record(past + start, len(part))
            out = np.ctypeslib.as_array(llama.llama_get_logits(self._ctx), shape=(len(part), self._n_vocab))
            rows.append(out if step == n else out.copy())
        self._tokens += tokens[: trees.trunk + 1]  # the root and its trunk; keep_branch records the rest
        trees.nodes = [int(t) for t in tokens]
        out = rows[0] if len(rows) == 1 else np.concatenate(rows)
        return out[trees.trunk :]

    def _check_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> None:
        n = len(tokens)
        if not 0 < n <= self.capabilities.max_block or len(self._tokens) + n > self.info.n_ctx:
            raise InvalidRequestError(
                f"a tree of {n} tokens does not fit the batch or the context", "verify fewer nodes, or a chain"
            )
        if len(parents) != n or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise InvalidRequestError("a tree needs one root (parent -1) first and every parent before its child")
        if any(not 0 <= t < self._n_vocab for t in tokens):
            raise InvalidRequestError(f"a tree token is outside {self.info.name}'s vocabulary of {self._n_vocab}")
        assert self._trees is not None
        if self._trees.branches(parents) > BRANCHES:
            raise InvalidRequestError(f"a tree of more than {BRANCHES} branches", "verify fewer branches")

    def keep_branch(self, path: Sequence[int]) -> None:
        assert self._trees is not None and self._trees.open, "keep_branch follows eval_tree"
        trees = self._trees
        path = [*range(trees.trunk), *(node + trees.trunk for node in path)]
        past = trees.keep(path)
        kept = [trees.nodes[i] for i in path]
        # A path off sequence 0 sits in cells after the other branches' holes, where the next
        # tokens would land before it; flash attention sums cells in their order, so that cache
        # rounds unlike a clean pass's. Its part off sequence 0 is evaluated again, in order: at
        # the head of the next pass (folds_branch), or at once where kernels split passes.
        off = next((k for k, node in enumerate(path) if trees.seqs[node][0] != 0), len(path))
        self._tokens[past:] = kept[:off]
        # The whole path's rows at its positions, as a chain pass leaves them (each node's row
        # is its root path's): a drafter reads them before the next pass evaluates the rest.
        for rows in self._recorded:
            rows.keep_path(past, path)
        self._unrecorded = off < len(path)
        if off < len(path):
            self.rollback(past + off)
            if self.capabilities.folds_branch:
                self._deferred = kept[off:]  # evaluated at the head of the next pass
                self._tokens += self._deferred
            else:
                self.eval_block(kept[off:], "none")

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
        if self._recurrent is not None:
            self._rewind(n)
            return
        # Unconditionally: the cache may hold positions the token record does not (see _unrecorded).
        llama.llama_memory_seq_rm(self._mem, 0, n, -1)
        del self._tokens[n:]
        self._unrecorded = False

    def _rewind(self, n: int) -> None:
        assert self._recurrent is not None
        cached = len(self._tokens) + (self._in_flight if self._unrecorded else 0)
        kept = self._tokens[:n]
        self._unrecorded = False
        start = self._recurrent.rewind(min(n, cached), cached)
        if start is not None:  # the state went back further: decode what it lacks again
            del self._tokens[start:]
            step = self.capabilities.max_block
            for at in range(start, len(kept), step):
                self.eval_block(kept[at : at + step], "none")
        del self._tokens[n:]
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

    def _adopt(self, head: H) -> H:
        self._heads.append(head)  # it reads this model and this context: closed before them
        return head

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """SelfDrafting: the model's MTP head, or a qspec or layerskip drafter (drafters.make_self_drafter)."""
        if kind == "mtp":
            return self.mtp_head()
        return drafters.make_self_drafter(self._host(), kind, option)

    def derived_drafters(self, kind: str) -> list[tuple[str, Path]]:
        """SelfDrafting: every candidate drafter of a kind, derived (once) for a side-by-side measurement."""
        return drafters.derived_drafters(self._host(), kind)

    def mtp_head(self) -> MtpHead:
        """The model's own MTP block as a drafter (strategy mtp)."""
        self._live()
        return self._adopt(drafters.mtp_head(self._host()))

    def assistant_head(self, path: str) -> MtpHead:
        """A Gemma 4 assistant GGUF (architecture gemma4-assistant) drafting for this target."""
        self._live()
        head = self._adopt(drafters.assistant_head(self._host(), path))
        # It reads this context's KV cache as it drafts. Its trees keep plain decoding's
        # greedy output, but the tests' assistant never has a runner-up taken when sampling,
        # so the sampled path after a taken branch is unexercised: chains only until it is.
        self.capabilities = replace(self.capabilities, branches=1)
        return head

    def eagle3_head(self, path: str) -> Eagle3Head:
        """An EAGLE-3 head GGUF (architecture eagle3) drafting for this target (strategy eagle3)."""
        self._live()
        return self._adopt(drafters.eagle3_head(self._host(), path))

    def attach_head(self, kind: str, path: str) -> ContextHead:
        """DrafterHost: a Gemma 4 assistant ("assistant") or an EAGLE-3 head ("eagle3") from its GGUF."""
        if kind == "assistant":
            return self.assistant_head(path)
        if kind == "eagle3":
            return self.eagle3_head(path)
        raise cannot_attach(kind, path, self.info.backend)

    def attach_block_drafter(self, path: str) -> DFlashDrafter:
        """DrafterHost: the DFlash drafter in `path`, or the DSpark drafter (a DFlash file with a Markov head)."""
        check_gguf(path)
        return self.dspark_drafter(path) if read_header(path).block_kind == "dspark" else self.dflash_drafter(path)

    def dspark_drafter(self, path: str) -> DSparkDrafter:
        """A DSpark drafter GGUF drafting blocks for this target (strategy dspark)."""
        self._live()
        return self._adopt(drafters.dspark_drafter(self._host(), path))

    def dflash_drafter(self, path: str) -> DFlashDrafter:
        """A DFlash drafter GGUF drafting blocks for this target (strategy dflash)."""
        self._live()
        return self._adopt(drafters.dflash_drafter(self._host(), path))

    def _target_states(self) -> HiddenRows:
        if self._states is None:
            self._greedy.detach()  # a head reads this context's passes: their outputs stay whole
            width = int(llama.llama_model_n_embd_out(self._model))
            self._states = last_hidden_states(self._ctx, self.info.n_ctx, width)
            self._recorded.append(self._states)
            self.rollback(0)  # positions decoded before now have no states: decode them again
        return self._states

    def layer_features(self, ids: Sequence[int], width: int, drafter: str, kind: str) -> HiddenRows:
        """The inputs of layers `ids` at every cached position, for a drafter (an EAGLE-3 head,
        a DFlash drafter) made for a target `width` wide; refused with what fits when this
        target cannot give them (features.check_capture)."""
        self._live()
        n_embd = int(llama.llama_model_n_embd(self._model))
        check_capture(
            TargetShape(self.info.name, self.info.architecture, self.info.n_layers, n_embd), drafter, kind, ids, width
        )
        key = tuple(ids)
        if key not in self._captures:
            self._greedy.detach()  # as for an MTP head's states
            self._captures[key] = layer_inputs(self._ctx, self.info.n_ctx, key, n_embd)
            self._recorded.append(self._captures[key])
            self.rollback(0)  # positions decoded before now have no rows: decode them again
        return self._captures[key]


def load(path: str, mmproj: str | None = None, **options: Any) -> LlamaCppBackend:
    backend = LlamaCppBackend(path, **options)
    if mmproj is not None:  # the target's alone: drafters derived from it read text
        backend.see_images(mmproj)
    return backend
