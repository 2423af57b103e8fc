"""llama.cpp as a library: its log, its build (kernels, buffer types, flash attention) and
the process-wide kernel switch exact output needs. Shared by the backend, its derived
drafters and the rpc-server."""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from localspec.core.errors import BackendUnavailableError, InvalidRequestError

try:
    import llama_cpp
except ImportError as exc:  # pragma: no cover - depends on the install
    raise BackendUnavailableError(
        "the llama.cpp backend needs llama-cpp-python",
        "pip install 'localspec[llamacpp]' (compiles llama.cpp, about 10 minutes on 2 cores)",
    ) from exc
llama = llama_cpp  # the binding, for the modules beside this one to take from here

_LOG_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_heard: list[str] | None = None  # llama.cpp's log while log_lines() listens


@llama.llama_log_callback  # type: ignore[misc,untyped-decorator]
def _quiet_log(level: int, text: bytes, user_data: Any) -> None:
    # llama.cpp narrates every load on stderr; localspec explains failures itself.
    if _heard is not None:
        _heard.append(text.decode(errors="replace"))
    if os.environ.get("LOCALSPEC_LLAMA_LOG") == "1" and level == _LOG_LEVEL_ERROR:
        os.write(2, b"llama.cpp: " + text)


@contextmanager
def log_lines() -> Iterator[list[str]]:
    """What llama.cpp logs while the block runs, in the pieces it writes (the buffer sizes it
    reserves, which benchmarks/lane_memory.py reads); one listener at a time."""
    global _heard
    init_library()
    heard: list[str] = []
    _heard = heard
    try:
        yield heard
    finally:
        _heard = None


@cache
def init_library() -> None:
    llama.llama_log_set(_quiet_log, ctypes.c_void_p(0))
    llama.llama_backend_init()


@cache
def build_id(buffers: bool) -> str:
    """Which llama.cpp this is: the binding's version and a digest of the library's own
    feature line (SIMD, LLAMAFILE, REPACK...), and whether the model's weights are in its extra
    buffer types (buffers). A rebuilt or upgraded library has other kernels, hence another
    cost curve: calibrations are cached under this."""
    features = (llama.llama_print_system_info() or b"") + (b"" if buffers else b"no-extra-buffers")
    features += f"flash-attn={flash_attention()}".encode()
    return f"{llama.__version__}+{hashlib.sha1(features).hexdigest()[:10]}"


# ggml types llama.cpp's AMX buffer multiplies on AMX tiles (ggml-cpu/amx/common.h,
# qtype_has_amx_kernels): Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS. It takes F16 too, with
# AVX-512 kernels alone, which run wherever the build does.
AMX_TILE_TYPES = frozenset({2, 3, 8, 12, 13, 14, 23})


@cache
def extra_buffers(types: frozenset[int] | None = None) -> bool:
    """Whether llama.cpp may put a model's weights in its extra buffer types (repacked and AMX
    layouts); types: the ggml types of the model's matrices (None: any model, as for a head's
    file). LLAMA_ARG_REPACK decides when set, as for llama.cpp's own programs. Otherwise a build
    with AMX kernels keeps them off for a model with a type its AMX tiles multiply: those
    faulted on the first matmul of a VM that advertises AMX without running it (llama.cpp#20824).
    An F16 model keeps them, as llama.cpp does: its verify passes of 2 to 4 rows cost less there
    (benchmarks/pages/ngram.md)."""
    setting = os.environ.get("LLAMA_ARG_REPACK", "").lower()
    if setting:
        return setting not in ("0", "false", "off")
    if b"AMX_INT8 = 1" not in (llama.llama_print_system_info() or b""):
        return True
    return types is not None and not types & AMX_TILE_TYPES


def model_params(gpu_layers: int) -> Any:
    """llama_model_params for a model on this machine: gpu_layers layers on its GPU, the rest on
    its CPU, in the extra buffer types where they may go (extra_buffers)."""
    mparams = llama.llama_model_default_params()
    mparams.n_gpu_layers = gpu_layers
    mparams.use_extra_bufts = extra_buffers()
    return mparams


EXACT_BUILD = (
    'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF -DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python==0.3.36"
)
_passes_ran = False  # a context of this process has run with ggml's default kernel choice


def weights_once(models: dict[str, Any] | None, path: str, load: Callable[[], Any]) -> tuple[Any, bool]:
    """A drafter file's weights, and whether the drafter owns (frees) them. models: the weights a
    host keeps by file and frees itself (lanes.py: one copy for every lane's drafter), loaded
    into it once; None: loaded for this drafter alone."""
    if models is None:
        return load(), True
    if path not in models:
        models[path] = load()
    return models[path], False


def note_default_kernels() -> None:
    """A context is about to run with ggml's default kernel choice: exact kernels can no
    longer be chosen in this process (use_exact_kernels)."""
    global _passes_ran
    _passes_ran = True


def cpu_kernels() -> str:
    """The instruction set this process's CPU kernels were built for (a CPU variant swapped in
    through LD_LIBRARY_PATH included), named as host kinds are: AVX-512 (VNNI, BF16), AVX2..."""
    info = (llama.llama_print_system_info() or b"").decode()
    if "AVX512 = 1" in info:
        extras = [
            label
            for key, label in (("AVX512_VNNI", "VNNI"), ("AVX512_BF16", "BF16"), ("AMX_INT8", "AMX"))
            if f"{key} = 1" in info
        ]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    for key, label in (("AVX2", "AVX2"), ("AVX", "AVX"), ("NEON", "NEON")):
        if f"{key} = 1" in info:
            return label
    return "generic (no SIMD)"


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
    (tests/specification/test_llamacpp_greedy.py), so only LLAMA_ARG_FLASH_ATTN (on, off, auto), llama.cpp's
    own variable, turns it off."""
    chosen = os.environ.get("LLAMA_ARG_FLASH_ATTN", "").strip().lower()
    return int(FLASH_ATTN.get(chosen, FLASH_ATTN["auto"]))
