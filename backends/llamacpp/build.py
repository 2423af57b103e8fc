"""Building a llama.cpp target as the load options ask: its model (on this machine's GPU and
CPU, or on RPC servers), its context (KV cache) and the one reusable batch."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from localspec.backends.llamacpp import rpc as rpc_entry_points
from localspec.common.gguf_header import ASSISTANT_ARCHITECTURE, assistant_alone, diagnose_gguf, load_failure_hint
from localspec.core.errors import InvalidRequestError, ModelLoadError

from . import library
from .abort import Abort
from .library import flash_attention, llama
from .state import TargetState
from .tree import BRANCHES, TreePass


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


class BuildsTarget(TargetState):
    """The parts of LlamaCppBackend's constructor that make its model, context and batch."""

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
