"""Cheap checks on a model file before a backend opens it, and a diagnosis when it fails."""

from __future__ import annotations

import math
import os

from localspec.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


def check_gguf(path: str) -> None:
    """Refuse what is plainly not a GGUF model, with the reason; costs one 4-byte read."""
    if not os.path.exists(path):
        raise ModelLoadError(
            f"no model file at {path}",
            "check the path, or run `localspec run` without --model to use the embedded default",
        )
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a folder, not a GGUF file", "point to the .gguf file inside it")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})",
            "llama.cpp reads GGUF; convert safetensors with llama.cpp's convert_hf_to_gguf.py",
        )


def diagnose_gguf(path: str) -> str:
    """Why llama.cpp may have refused a file that starts like a GGUF: reads the header fully."""
    from localspec.gguf_header import read_header

    try:
        header = read_header(path)
        end = max((t.offset + tensor_bytes(t.dims, t.qtype) for t in header.tensors), default=0)
    except (ModelLoadError, ValueError) as exc:  # an unknown tensor type reads as damage too
        cause = exc.__cause__ or exc
        return f"the file is truncated or damaged ({type(cause).__name__}: {cause}); download it again"
    size = os.path.getsize(path)
    if end > size:
        return f"the file is truncated: its tensors need {end} bytes but it has {size}; download it again"
    arch = header.meta.get("general.architecture")
    if arch is not None:
        return f"its architecture is {arch!r}; this llama.cpp build may not support it"
    return "its header has no general.architecture key"


def tensor_bytes(dims: tuple[int, ...], qtype: int) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return math.prod(dims) // block * size
