"""Cheap checks on a model file before a backend opens it, and a diagnosis when it fails."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Sequence
from typing import BinaryIO

from localspec.core.errors import InvalidRequestError, ModelLoadError

GGUF_MAGIC = b"GGUF"

# What a path that is not a regular file is, for the message (stat's S_IS* tests).
_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_model_file(path: str | os.PathLike[str]) -> BinaryIO:
    """path opened for reading, refused unless it is a regular file (or a symlink to one):
    opening a named pipe blocks until a writer comes, and a device never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ModelLoadError(
            f"no model file at {path}",
            "check the path, or run `localspec run` without --model to use the embedded default",
        ) from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from exc
    _refuse_special(path, mode)
    try:
        # O_NONBLOCK: were the path swapped for a pipe after the stat, the open still returns
        # at once and the fstat below refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    try:
        _refuse_special(path, os.fstat(fd).st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _refuse_special(path: str | os.PathLike[str], mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise ModelLoadError(f"{path} is a folder, not a GGUF file", "point to the .gguf file inside it")
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "not a regular file")
    raise ModelLoadError(
        f"{path} is {kind}, not a GGUF file on disk",
        "point to the .gguf file itself (a regular file, or a symlink to one); copy a streamed model to disk first",
    )


def check_gguf(path: str) -> None:
    """Refuse what is plainly not a GGUF model, with the reason; costs one 4-byte read."""
    try:
        with open_model_file(path) as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})",
            "llama.cpp reads GGUF; convert safetensors with llama.cpp's convert_hf_to_gguf.py",
        )


def assistant_alone(path: str) -> InvalidRequestError:
    """The refusal of an MTP assistant GGUF (Gemma 4's) opened as a model of its own: it
    drafts from inside its target, whose width it was made for."""
    from localspec.core.gguf_header import read_header

    header = read_header(path)
    width = header.meta.get(f"{header.architecture}.embedding_length_out")
    name = os.path.basename(path)
    target = name[len("mtp-") : -len(".gguf")] if name.startswith("mtp-") and name.endswith(".gguf") else None
    belongs = f"the Gemma 4 model {target}" if target else "the Gemma 4 model it was released with"
    return InvalidRequestError(
        f"{name} is a Gemma 4 MTP assistant, which drafts for {belongs}"
        + (f" (hidden size {width})" if isinstance(width, int) else "")
        + " and generates nothing on its own",
        f"run the target with it as its drafter: --model {f'{target}….gguf' if target else 'TARGET.gguf'} "
        f"--draft-model {path}",
    )


def diagnose_gguf(path: str) -> str:
    """Why llama.cpp may have refused a file that starts like a GGUF: reads the header fully."""
    from localspec.core.gguf_header import read_header

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
    blocks = header.meta.get(f"{arch}.block_count")
    for key in ("attention.sliding_window_pattern", "attention.head_count", "feed_forward_length"):
        entries = header.meta.get(f"{arch}.{key}")
        if isinstance(entries, list) and isinstance(blocks, int) and len(entries) != blocks:
            return f"its {arch}.{key} has {len(entries)} entries for its {blocks} blocks"
    if arch is not None:
        return f"its architecture is {arch!r}; this llama.cpp build may not support it"
    return "its header has no general.architecture key"


def tensor_bytes(dims: tuple[int, ...], qtype: int) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return math.prod(dims) // block * size


def quantized_bytes(source: str, ftype: str, prune_layers: Sequence[int] = ()) -> int:
    """About how many bytes source requantized to ftype ("Q4_K_M": its main type, Q4_K)
    takes, without the pruned blocks: what a requantization must find free on its disk."""
    import gguf

    from localspec.core.gguf_header import read_header

    qtype = gguf.GGMLQuantizationType[ftype.removesuffix("_M").removesuffix("_S")]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    pruned = tuple(f"blk.{i}." for i in prune_layers)
    total = 0
    for tensor in read_header(source).tensors:
        if pruned and tensor.name.startswith(pruned):
            continue
        n = math.prod(tensor.dims)
        # Rows that do not split into the type's blocks stay F32, as llama.cpp keeps them.
        total += n // block * size if tensor.dims and tensor.dims[0] % block == 0 else n * 4
    return total
