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
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.llamacpp import rpc as rpc_entry_points
from localspec.control.hardware import physical_cores
from localspec.control.selfdraft import best_drafter
from localspec.core.errors import BackendClosedError, BackendUnavailableError, InvalidRequestError, ModelLoadError
from localspec.core.gguf_check import check_gguf, diagnose_gguf
from localspec.core.gguf_header import read_header
from localspec.core.protocol import Backend, Capabilities, Logits, LogitsMode, ModelInfo, VocabIdentity

from .copies import QSPEC_SWEEP, Candidate, candidates, derived, derived_home
from .kernels import SPLIT_BLOCKS_UP_TO, KernelPlan, kernel_plan
from .mtp import MtpHead, TargetStates

try:
    import llama_cpp as llama
except ImportError as exc:  # pragma: no cover - depends on the install
    raise BackendUnavailableError(
        "the llama.cpp backend needs llama-cpp-python",
        "pip install 'localspec[llamacpp]' (compiles llama.cpp, about 10 minutes on 2 cores)",
    ) from exc

_LOG_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR


@llama.llama_log_callback  # type: ignore[misc,untyped-decorator]
def _quiet_log(level: int, text: bytes, user_data: Any) -> None:
    # llama.cpp narrates every load on stderr; localspec explains failures itself.
    if os.environ.get("LOCALSPEC_LLAMA_LOG") == "1" and level == _LOG_LEVEL_ERROR:
        os.write(2, b"llama.cpp: " + text)


@cache
def init_library() -> None:
    llama.llama_log_set(_quiet_log, ctypes.c_void_p(0))
    llama.llama_backend_init()


@cache
def build_id() -> str:
    """Which llama.cpp this is: the binding's version and a digest of the library's own
    feature line (SIMD, LLAMAFILE, REPACK...). A rebuilt or upgraded library has other
    kernels, hence another cost curve: calibrations are cached under this."""
    features = (llama.llama_print_system_info() or b"") + (b"" if extra_buffers() else b"no-extra-buffers")
    features += f"flash-attn={flash_attention()}".encode()
    return f"{llama.__version__}+{hashlib.sha1(features).hexdigest()[:10]}"


@cache
def extra_buffers() -> bool:
    """Whether llama.cpp may put weights in its extra buffer types (repacked and AMX layouts).
    LLAMA_ARG_REPACK decides when set, as for llama.cpp's own programs. Otherwise a build with
    AMX kernels keeps them off: those faulted on the first matmul of a VM that advertises AMX
    without running it."""
    setting = os.environ.get("LLAMA_ARG_REPACK", "").lower()
    if setting:
        return setting not in ("0", "false", "off")
    return b"AMX_INT8 = 1" not in (llama.llama_print_system_info() or b"")


EXACT_BUILD = (
    'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF -DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python==0.3.36"
)
_passes_ran = False  # a context of this process has run with ggml's default kernel choice


def batch_invariant_build() -> bool:
    """Whether this llama.cpp can give a block the logits of one-token passes: not with
    llamafile's tinyBLAS, which takes products of 2+ rows (attention without flash attention)
    in another summation order than the one-row kernel."""
    return b"LLAMAFILE = 1" not in (llama.llama_print_system_info() or b"")


def use_exact_kernels() -> None:
    """Make every pass of this process take the kernels a one-token pass takes: ggml's tiled
    K-quant matmul (blocks of 8+ rows) off. ggml reads its switch once, at the first pass, so
    this must come before any context has run."""
    if not batch_invariant_build():
        raise BackendUnavailableError(
            "exact output needs a llama.cpp built without llamafile (its matmuls of 2+ rows sum in "
            "another order than a one-token pass)",
            f"rebuild it once: {EXACT_BUILD}",
        )
    if os.environ.get("GGML_CPU_TILED_MM") != "0":
        if _passes_ran:
            raise InvalidRequestError(
                "exact output must be chosen before the first model of this process runs (llama.cpp reads "
                "its kernel switch once)",
                "load the exact runtime first, or start the process with GGML_CPU_TILED_MM=0",
            )
        os.environ["GGML_CPU_TILED_MM"] = "0"


FLASH_ATTN = {
    "on": llama.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    "auto": llama.LLAMA_FLASH_ATTN_TYPE_AUTO,
}


def flash_attention() -> int:
    """llama.cpp's flash attention: llama.cpp's own choice (on wherever the device has the
    kernel). Off decodes faster on the CPU at long contexts (benchmarks/flash_attention.py),
    but greedy speculative output then drifts from plain decoding after a rollback
    (tests/test_llamacpp_greedy.py), so only LLAMA_ARG_FLASH_ATTN (on, off, auto), llama.cpp's
    own variable, turns it off."""
    chosen = os.environ.get("LLAMA_ARG_FLASH_ATTN", "").strip().lower()
    return int(FLASH_ATTN.get(chosen, FLASH_ATTN["auto"]))


@dataclass(frozen=True)
class GpuDevice:
    name: str
    free_bytes: int


_GPU_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU and _IGPU
# What a GPU keeps free beside the layers it takes: the KV cache, the compute buffers.
GPU_RESERVE = 1 << 30


@cache
def gpu_device() -> GpuDevice | None:
    """The GPU this llama.cpp build runs on (a Metal, CUDA or Vulkan build), or None. Asked of
    ggml's device list: llama_supports_gpu_offload() says yes for any build with RPC, and an
    RPC server's device is another machine's."""
    from llama_cpp import llama_cpp as raw

    lib = raw._lib
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.ggml_backend_dev_count.restype = sz
    lib.ggml_backend_dev_get.argtypes, lib.ggml_backend_dev_get.restype = [sz], vp
    lib.ggml_backend_dev_type.argtypes, lib.ggml_backend_dev_type.restype = [vp], ctypes.c_int
    lib.ggml_backend_dev_description.argtypes, lib.ggml_backend_dev_description.restype = [vp], ctypes.c_char_p
    lib.ggml_backend_dev_backend_reg.argtypes, lib.ggml_backend_dev_backend_reg.restype = [vp], vp
    lib.ggml_backend_reg_name.argtypes, lib.ggml_backend_reg_name.restype = [vp], ctypes.c_char_p
    lib.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    init_library()
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) not in _GPU_TYPES:
            continue
        if (lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)) or b"") == b"RPC":
            continue
        free, total = sz(), sz()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        return GpuDevice((lib.ggml_backend_dev_description(dev) or b"GPU").decode(), int(free.value))
    return None


def gpu_layers_that_fit(n_layers: int, size_bytes: int, device: GpuDevice | None) -> int:
    """How many of a model's layers go to the GPU: all of them (and the output layer) where
    the weights fit beside GPU_RESERVE, else the share of the layers that does, none without one."""
    if device is None:
        return 0
    room = device.free_bytes - GPU_RESERVE
    if room >= size_bytes:
        return n_layers + 1
    return max(0, n_layers * room // max(size_bytes, 1))


def auto_gpu_layers(path: str, device: GpuDevice | None) -> int:
    """gpu_layers_that_fit for a GGUF file; its header is read only where a GPU is there."""
    if device is None:
        return 0
    meta = read_header(path).meta
    blocks = int(meta.get(f"{meta.get('general.architecture', '')}.block_count", 0) or 0)
    return gpu_layers_that_fit(blocks, os.path.getsize(path), device)


def _model_params(rpc: Sequence[str], gpu_layers: int) -> tuple[Any, Any]:
    """Model parameters: gpu_layers layers on this machine's GPU and the rest on its CPU, or
    every layer on the given RPC servers' devices (returned too: the array must outlive the load)."""
    mparams = llama.llama_model_default_params()
    mparams.n_gpu_layers = gpu_layers
    mparams.use_extra_bufts = extra_buffers()
    if not rpc:
        return mparams, None

    return mparams, rpc_entry_points.offload_to_servers(mparams, rpc)


# Per-token recurrent-state snapshots llama.cpp keeps from each decode of a hybrid model
# (n_rs_seq): up to this many rejected tokens go back with no replay. Every decode pays for
# them, plain steps too (BENCHMARKS.md §7), so they cover the short drafts a hybrid mostly
# gets; a longer rejection takes the state-copy path.
RECURRENT_SNAPSHOTS = 4


class RecurrentRollback:
    """Rollback for a model whose memory holds recurrent state. Cheapest way first:

    1. llama.cpp's own snapshots of the last decode (n_rs_seq; only the architectures its
       list names get them): a rejected draft inside the last block costs nothing;
    2. a copy of the recurrent state taken where the last rollback left off, restored, and
       the tokens since replayed: what a draft model's token-by-token drafts need, and any
       rollback on an architecture without snapshots. Copies start once a rollback needed one;
    3. a replay from the start (a rollback behind the copy: another request's prefix).

    rewind() says from which position the caller must replay (None: nothing to replay)."""

    def __init__(self, ctx: Any, mem: Any, snapshots: int) -> None:
        self._ctx, self._mem, self.snapshots = ctx, mem, snapshots
        self._last_block = 0  # tokens in the last decode: the snapshots cover these
        self._pending = False  # a snapshot rollback waits for the next decode (one per decode)
        self._copying = False  # rollbacks have needed copies: take one where each rollback ends
        self._copy_due = False
        self._copy: tuple[int, Any] | None = None  # (position, the recurrent state there)

    def before_decode(self, past: int) -> None:
        if self._copying and self._copy_due:
            size = llama.llama_state_seq_get_size_ext(self._ctx, 0, llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            buf = (ctypes.c_uint8 * size)()
            llama.llama_state_seq_get_data_ext(self._ctx, buf, size, 0, llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            self._copy = (past, buf)
        self._copy_due = False
        self._last_block = 0  # until this decode is known to have finished (after_decode)

    def after_decode(self, n: int) -> None:
        self._last_block, self._pending = n, False

    def settled(self) -> None:
        """A rollback (and its replay) is done: the next decode starts where drafts start."""
        self._copy_due = True

    def rewind(self, n: int, cached: int) -> int | None:
        """Keep the first n of the `cached` positions the memory holds."""
        drop = cached - n
        if drop <= 0:
            return None
        if (
            not self._pending
            and drop <= self.snapshots
            and drop < self._last_block
            and llama.llama_memory_seq_rm(self._mem, 0, n, -1)
        ):
            self._pending = True
            return None
        self._copying = True
        if self._copy is not None and self._copy[0] <= n:
            at, buf = self._copy
            flags = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if llama.llama_state_seq_set_data_ext(self._ctx, buf, len(buf), 0, flags) == len(buf):
                llama.llama_memory_seq_rm(self._mem, 0, at, -1)  # the attention layers' rows
                self._pending = False
                return at
        self._copy = None
        llama.llama_memory_seq_rm(self._mem, 0, 0, -1)
        self._pending = False
        return 0


class LlamaCppBackend:
    """One GGUF model with its own context (KV cache) on the CPU."""

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
    ) -> None:
        check_gguf(path)
        init_library()
        global _passes_ran
        if exact:
            use_exact_kernels()
        else:
            _passes_ran = True
        # What a derived drafter is loaded with: this machine's options, never the RPC split.
        self._options: dict[str, Any] = {"n_ctx": n_ctx, "threads": threads, "max_block": max_block}
        if gpu_layers is None:  # None: every layer that fits on this build's GPU, if it has one
            gpu_layers = 0 if rpc or exact else auto_gpu_layers(path, gpu_device())
        self._options["gpu_layers"] = gpu_layers
        if exact:
            self._options["exact"] = True
        mparams, self._devices = _model_params(rpc, gpu_layers)
        plan = self._kernel_plan(path, exact, bool(rpc or gpu_layers), bool(mparams.use_extra_bufts), threads)
        mparams.use_extra_bufts = plan.repack
        # A model's own MTP blocks (Qwen3.5's nextn layers, one block) are loaded whenever the
        # file has them: a drafting context on a model loaded without them aborts the process.
        mparams.load_mtp = True
        model = llama.llama_model_load_from_file(os.fsencode(path), mparams)
        if not model:
            raise ModelLoadError(
                f"llama.cpp could not load {path}: {diagnose_gguf(path)}",
                "download the file again or pick another model; LOCALSPEC_LLAMA_LOG=1 shows llama.cpp's log",
            )
        self._model = model
        self._mtp_layers = int(llama.llama_model_n_layer_nextn(model))
        self._vocab = llama.llama_model_get_vocab(model)
        self._n_vocab = int(llama.llama_vocab_n_tokens(self._vocab))
        n_ctx = min(n_ctx, int(llama.llama_model_n_ctx_train(model)) or n_ctx)
        threads = threads or physical_cores()
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = max_block
        cparams.n_ubatch = max_block
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # Rollback of a rejected draft needs the whole sliding-window cache (Gemma 3's, say):
        # a pruned window cannot give back the tokens it dropped.
        cparams.swa_full = True
        # Exact: flash attention on the CPU splits a one-token pass over the KV cache once it
        # holds 512 cells (one partial sum per thread), which a block never does.
        cparams.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED if exact else flash_attention()
        stateful = bool(llama.llama_model_is_recurrent(model) or llama.llama_model_is_hybrid(model))
        if stateful:  # a verify block stays one ubatch (see RecurrentRollback)
            plan = self._kernel_plan(path, exact, bool(rpc or gpu_layers), plan.repack, threads, stateful=True)
            cparams.n_rs_seq = recurrent_snapshots
            # The snapshots come from the last ubatch: a verify block must fit in one.
            cparams.n_ubatch = max(cparams.n_ubatch, recurrent_snapshots + 1)
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            llama.llama_model_free(model)
            raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for {path}")
        self._ctx = ctx
        self._mem = llama.llama_get_memory(ctx)
        # llama.cpp gives snapshots only to the architectures it lists (0 for the others).
        self._recurrent = RecurrentRollback(ctx, self._mem, int(llama.llama_n_rs_seq(ctx))) if stateful else None
        self._in_flight = 0  # tokens of a decode not yet in self._tokens (see _unrecorded)
        self._states: TargetStates | None = None  # hidden states an MTP head reads (mtp_head)
        self._heads: list[MtpHead] = []
        if rpc:
            rpc_entry_points.limit_waits(rpc)
        # llama.cpp caps the batch at a small requested n_ctx (then pads n_ctx): a block
        # larger than its batch would abort the process, so take its figure as ours.
        max_block = min(max_block, int(llama.llama_n_batch(ctx)))
        self._batch = llama.llama_batch_init(max_block, 0, 1)
        # numpy views over the batch's C arrays: filling a block is a few vector writes.
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(max_block,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(max_block,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(max_block,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(max_block,))[:] = 1
        for i in range(max_block):
            self._batch.seq_id[i][0] = 0
        self._tokens: list[int] = []
        # True while the cache may hold positions past self._tokens: an exception (Ctrl+C)
        # that lands after llama_decode filled the cache but before the tokens were recorded.
        self._unrecorded = False
        self._closed = False
        self._piece_buf = ctypes.create_string_buffer(256)
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
        if plan.max_rows:  # verify blocks in pieces: another cost curve
            extra["verify_rows"] = str(plan.max_rows)
        self._max_rows = plan.max_rows or max_block
        self.exactness = plan.exactness  # whether greedy answers are plain decoding's (core.exactness)
        device = gpu_device() if gpu_layers and not rpc else None
        if device is not None:  # another device, another cost curve
            extra["gpu"] = f"{device.name} ({gpu_layers} layers)"
        self.capabilities = Capabilities(
            rollback=True, max_block=max_block, device="rpc" if rpc else ("gpu" if device else "cpu"), extra=extra
        )

    @staticmethod
    def _kernel_plan(
        path: str, exact: bool, offloaded: bool, repack: bool, threads: int | None, stateful: bool = False
    ) -> KernelPlan:
        return kernel_plan(
            (t.qtype for t in read_header(path).tensors if len(t.dims) > 1),  # matrices, not norms
            exact=exact,
            llamafile=not batch_invariant_build(),
            flash=not exact and flash_attention() != FLASH_ATTN["off"],
            threads=threads or physical_cores(),
            repack=repack,
            repack_forced=os.environ.get("LLAMA_ARG_REPACK", "").lower() not in ("", "0", "false", "off"),
            stateful=stateful,
            offloaded=offloaded,
        )

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
        self._live()
        n = llama.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, False)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, big, len(big), 0, False)
            return big.raw[:n]
        return self._piece_buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # -- evaluation -------------------------------------------------------------------------

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        self._live()
        n = len(tokens)
        if logits == "all" and self._max_rows < n <= SPLIT_BLOCKS_UP_TO:  # a verify block, in one-token kernels
            step = self._max_rows
            return np.concatenate([self.eval_block(tokens[i : i + step], "all").copy() for i in range(0, n, step)])
        if n > self.capabilities.max_block:
            raise InvalidRequestError(f"a block of {n} tokens exceeds the batch of {self.capabilities.max_block}")
        if len(self._tokens) + n > self.info.n_ctx:
            raise InvalidRequestError(f"the context of {self.info.n_ctx} tokens is full")
        if n == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        self._tok[:n] = tokens
        if int(self._tok[:n].min()) < 0 or int(self._tok[:n].max()) >= self._n_vocab:
            bad = next(int(t) for t in tokens if not 0 <= t < self._n_vocab)
            raise InvalidRequestError(
                f"token id {bad} is outside {self.info.name}'s vocabulary of {self._n_vocab}",
                "tokenize with the model that evaluates, or use a drafter with the target's tokenizer",
            )
        past = len(self._tokens)
        self._pos[:n] = np.arange(past, past + n)
        self._out[:n] = 0
        if logits == "all":
            self._out[:n] = 1
        elif logits == "last":
            self._out[n - 1] = 1
        if self._unrecorded:
            self.rollback(past)
        self._batch.n_tokens = n
        if self._recurrent is not None:
            self._recurrent.before_decode(past)
        self._unrecorded, self._in_flight = True, n
        rc = llama.llama_decode(self._ctx, self._batch)
        if rc != 0:
            # A failed decode leaves the cache as it was before the batch.
            self._unrecorded = False
            raise InvalidRequestError(f"llama_decode failed with code {rc} at position {past}")
        if self._recurrent is not None:
            self._recurrent.after_decode(n)
        if self._states is not None:
            self._states.record(past, n)
        self._tokens.extend(tokens)
        self._unrecorded = False
        rows = n if logits == "all" else (1 if logits == "last" else 0)
        if rows == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        ptr = llama.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self._n_vocab))

    def rollback(self, n: int) -> None:
        self._live()
        if n < 0:
            raise InvalidRequestError(f"rollback needs a token count of 0 or more, got {n}")
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
        llama.llama_batch_free(self._batch)
        llama.llama_free(self._ctx)
        llama.llama_model_free(self._model)

    def __del__(self) -> None:
        if hasattr(self, "_closed"):
            self.close()

    # -- self-drafting ----------------------------------------------------------------------

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """The qspec or layerskip drafter (localspec.core.protocol.SelfDrafting), derived once per
        model file and loaded beside this one; without option, the measured best candidate."""
        if kind == "mtp":
            return self.mtp_head()
        self._can_skip_layers(kind)
        folder, ftype = derived_home(self)
        options = {c.label: c for c in candidates(kind, option, self.info.n_layers, ftype)}

        def make(label: str) -> LlamaCppBackend:
            c = options[label]
            drafter = LlamaCppBackend(str(derived(self.info.path, c.ftype, folder, c.prune)), **self._options)
            extra = {**drafter.capabilities.extra, "self_draft": f"{kind}:{label}"}
            drafter.capabilities = replace(drafter.capabilities, extra=extra)
            return drafter

        return best_drafter(self, kind, list(options), make)

    def mtp_head(self) -> MtpHead:
        """The model's own MTP block as a drafter (strategy mtp)."""
        self._live()
        if not self._mtp_layers:
            raise InvalidRequestError(
                f"{self.info.name} has no MTP head: its GGUF keeps no nextn layers",
                "use a GGUF converted with its MTP layers (the *-MTP-GGUF repositories), or --strategy ngram",
            )
        self._heads.append(MtpHead(self, self._model, self._ctx, self._target_states()))
        return self._heads[-1]

    def assistant_head(self, path: str) -> MtpHead:
        """A Gemma 4 assistant GGUF (architecture gemma4-assistant) drafting for this target."""
        self._live()
        check_gguf(path)
        if self.info.architecture != "gemma4":
            raise InvalidRequestError(
                f"{os.path.basename(path)} is a Gemma 4 assistant: it drafts for a gemma4 model, "
                f"not {self.info.name} ({self.info.architecture})",
                "pair it with the Gemma 4 model it was made for, or use --strategy ngram",
            )
        mparams, _ = _model_params((), self._options["gpu_layers"])
        mparams.load_mtp = True  # its blocks are all MTP blocks
        model = llama.llama_model_load_from_file(os.fsencode(path), mparams)
        if not model:
            raise ModelLoadError(
                f"llama.cpp could not load {path}: {diagnose_gguf(path)}",
                "download the assistant again, or draft without it (--strategy ngram)",
            )
        if llama.llama_model_n_embd_out(model) != llama.llama_model_n_embd_out(self._model):
            llama.llama_model_free(model)
            raise InvalidRequestError(
                f"{os.path.basename(path)} was made for a Gemma 4 model of another width than {self.info.name}",
                "use the assistant of the same size (E4B with E4B, 12B with 12B, 31B with 31B)",
            )
        head = MtpHead(self, model, self._ctx, self._target_states(), assistant=True)
        head.info = replace(head.info, name=os.path.basename(path), size_bytes=int(llama.llama_model_size(model)))
        self._heads.append(head)
        return head

    def _target_states(self) -> TargetStates:
        if self._states is None:
            width = int(llama.llama_model_n_embd_out(self._model))
            self._states = TargetStates(self._ctx, self.info.n_ctx, width)
            self.rollback(0)  # positions decoded before now have no states: decode them again
        return self._states

    def _can_skip_layers(self, kind: str) -> None:
        if kind == "layerskip" and self._recurrent is not None:
            # The blocks' kinds follow from their indices (every n-th is attention): a copy
            # with blocks left out would run recurrent weights as attention and fail to load.
            raise InvalidRequestError(
                f"layerskip cannot draft for {self.info.name}: a {self.info.architecture} model mixes recurrent "
                "and attention blocks by position, so blocks cannot be left out",
                "use --strategy ngram (the default), qspec, or a draft model",
            )

    def derived_drafters(self, kind: str) -> list[tuple[str, Path]]:
        """Every candidate drafter of a kind, derived (once) for a side-by-side measurement."""
        self._can_skip_layers(kind)
        folder, ftype = derived_home(self)
        if kind == "qspec":
            options = [Candidate(t, t) for t in QSPEC_SWEEP if t != ftype]
        else:
            options = candidates(kind, None, self.info.n_layers, ftype)
        return [(c.label, derived(self.info.path, c.ftype, folder, c.prune)) for c in options]


def load(path: str, **options: Any) -> LlamaCppBackend:
    return LlamaCppBackend(path, **options)
