"""Derives other precisions of a GGUF with llama.cpp's own quantize call: the F16 target
and low-bit drafters the benchmarks use, and later the QSpec-style self-drafter."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

from localspec.errors import BackendUnavailableError, InvalidRequestError, ModelLoadError
from localspec.gguf_check import check_gguf
from localspec.hardware import physical_cores
from localspec.registry import SPLIT_GGUF

# llama_ftype values (llama.h)
FTYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def quantize(source: str | Path, dest: str | Path, ftype: str, prune_layers: Sequence[int] = ()) -> Path:
    """Write source requantized to ftype at dest (atomically), leaving out the transformer
    blocks in prune_layers (llama.cpp renumbers the rest); returns dest."""
    try:
        import llama_cpp as llama

        from localspec.backends.llamacpp import init_library
    except ImportError as exc:
        raise BackendUnavailableError("quantizing needs llama-cpp-python", "pip install 'localspec[llamacpp]'") from exc
    init_library()  # quiets llama.cpp's log
    if ftype not in FTYPES:
        raise InvalidRequestError(f"unknown quantization type {ftype!r}", f"choose one of: {', '.join(FTYPES)}")
    check_gguf(str(source))
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    params = llama.llama_model_quantize_default_params()
    params.nthread = physical_cores()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    if prune_layers:
        # llama.cpp reads a sorted list ended by -1; keep the array alive until the call returns.
        prune = (ctypes.c_int32 * (len(prune_layers) + 1))(*sorted(set(prune_layers)), -1)
        params.prune_layers = ctypes.cast(prune, type(params.prune_layers))
    rc = llama.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
    if rc != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        raise ModelLoadError(f"llama.cpp could not quantize {source} to {ftype} (code {rc})")
    os.replace(partial, dest)
    return dest


def derived(source: str | Path, ftype: str, folder: str | Path, prune_layers: Sequence[int] = ()) -> Path:
    """source at ftype (minus pruned blocks) inside folder, made once and reused."""
    tag = f".skip{'-'.join(map(str, sorted(set(prune_layers))))}" if prune_layers else ""
    split = SPLIT_GGUF.match(Path(source).name)  # llama.cpp reads a split model through its first shard
    stem = split["prefix"] if split else Path(source).stem
    dest = Path(folder) / f"{stem}{tag}.{ftype}.gguf"
    return dest if dest.exists() else quantize(source, dest, ftype, prune_layers)
