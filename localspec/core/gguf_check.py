"""Cheap checks on a model file before a backend opens it, and a diagnosis when it fails."""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from localspec.core.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
UPGRADE = "pip install -U localspec llama-cpp-python"


class NewerGGUFError(ValueError):
    """A GGUF of a version newer than this reader's: not damage, an old reader."""


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
        if exc.errno == errno.ELOOP:
            raise symlink_loop(path) from None
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


def symlink_loop(path: str | os.PathLike[str]) -> ModelLoadError:
    return ModelLoadError(
        f"{path} is a symlink loop: its links lead back to themselves, never to a file",
        "point to the .gguf file itself (`ls -l` shows where each link leads)",
    )


def resolve_model_path(path: Path) -> Path:
    """path made absolute with its links followed; a symlink loop is refused as such."""
    try:
        return path.expanduser().resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # Python < 3.13 raises RuntimeError for a loop
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise ModelLoadError(f"cannot read {path}: {exc.strerror}", "check the path") from exc
        raise symlink_loop(path) from None


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


def diagnose_gguf(path: str) -> str:
    """Why llama.cpp may have refused a file that starts like a GGUF: reads the header fully."""
    from localspec.core.gguf_header import read_header

    try:
        header = read_header(path)
        end = max((t.offset + tensor_bytes(t.dims, t.qtype) for t in header.tensors), default=0)
    except (ModelLoadError, ValueError) as exc:  # an unknown tensor type reads as damage too
        cause = exc.__cause__ or exc
        if isinstance(cause, NewerGGUFError):
            return f"{cause}: it needs a newer localspec and llama.cpp ({UPGRADE})"
        return f"the file is truncated or damaged ({type(cause).__name__}: {cause}); download it again"
    size = os.path.getsize(path)
    if end > size:
        return f"the file is truncated: its tensors need {end} bytes but it has {size}; download it again"
    arch = header.meta.get("general.architecture")
    if arch is not None:
        return f"its architecture is {arch!r}; this llama.cpp build may not support it"
    return "its header has no general.architecture key"


def check_whole_gguf(path: str | Path) -> None:
    """Refuse a GGUF whose header is damaged or whose tensors run past its end (a cut
    download), before it is registered: reads the header only."""
    from localspec.core.gguf_header import read_header

    header = read_header(path)
    try:
        end = max((t.offset + tensor_bytes(t.dims, t.qtype) for t in header.tensors), default=0)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"{path} has a tensor of a type this localspec does not know ({exc})",
            f"a newer localspec and llama-cpp-python may read it ({UPGRADE}); else download the file again",
        ) from None
    size = os.path.getsize(path)
    if end > size:
        raise ModelLoadError(
            f"{path} is truncated: its tensors need {end} bytes but it has {size}", "download the file again"
        )


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
