"""GGUF files: opening one safely, refusing what is not one, and its header (metadata and
tensor table) read without loading any weights.

Read here rather than with gguf.GGUFReader, which builds a numpy view per vocabulary string
and takes seconds on a 50k-token vocabulary. Every GGUF reader in localspec (the torch and MLX
backends, the pair check, the load-failure diagnosis) goes through `read_header`.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import VocabIdentity

# llama.cpp's split GGUF names (llama-gguf-split): PREFIX-00001-of-00003.gguf
SPLIT_GGUF = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")

# ggml type ids (ggml.h) by name, for the types the backends tell apart.
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K"}
GGML_TYPES |= {12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 20: "IQ4_NL", 23: "IQ4_XS", 30: "BF16", 39: "MXFP4"}

# GGUF's tokenizer.ggml.model -> the vocabulary kinds llama.cpp reports (see backends/llamacpp/backend.py)
GGUF_TOKENIZER_KINDS = {"llama": "spm", "gpt2": "bpe", "bert": "wpm", "t5": "ugm", "rwkv": "rwkv", "plamo2": "plamo2"}

# GGUF value types (gguf.GGUFValueType): fixed-size scalars as struct codes
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# Arrays of arrays nest this deep at most: no GGUF writer nests at all beyond one level, and a
# crafted file nesting thousands deep would otherwise end in a RecursionError.
_MAX_NESTING = 8
KNOWN_VERSIONS = (2, 3)
UPGRADE = "pip install -U localspec llama-cpp-python"


class NewerGGUFError(ValueError):
    """A GGUF of a version newer than this reader's: not damage, an old reader."""


_NUMPY: dict[int, npt.DTypeLike] = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32}
_NUMPY.update({6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64})


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # fastest-varying first, as GGUF lists them
    qtype: int
    offset: int  # from the start of the file

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.qtype, f"type {self.qtype}")


# llama.cpp's architecture name (with its hyphen) of Gemma 4's MTP assistant, a file of its own.
ASSISTANT_ARCHITECTURE = "gemma4-assistant"
# A DSpark drafter is a dflash file with a Markov head: llama.cpp tells the two by this tensor.
MARKOV_HEAD_TENSOR = "markov_w1.weight"


@dataclass
class GGUFHeader:
    path: str
    meta: dict[str, Any]
    tensors: list[GGUFTensor]
    data_offset: int  # where the tensor data starts

    @property
    def architecture(self) -> str:
        return str(self.meta.get("general.architecture", "?"))

    @property
    def nextn_layers(self) -> int:
        """The MTP blocks the file carries: a model's own head (Qwen3.5's nextn layers), or
        every block of an MTP drafter file (Gemma 4's assistant); 0 for none."""
        layers = self.meta.get(f"{self.architecture}.nextn_predict_layers", 0)
        return layers if isinstance(layers, int) and not isinstance(layers, bool) else 0

    @property
    def is_assistant(self) -> bool:
        """An MTP assistant file (Gemma 4's), which drafts from inside its target's context."""
        return self.architecture == ASSISTANT_ARCHITECTURE

    @property
    def block_kind(self) -> str | None:
        """The block drafter the file is: "dspark" (a dflash file with a Markov head, as
        llama.cpp's common/speculative.cpp tells them), "dflash", or None for neither."""
        if self.architecture != "dflash":
            return None
        return "dspark" if any(t.name == MARKOV_HEAD_TENSOR for t in self.tensors) else "dflash"


class _Cursor:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, code: str) -> Any:
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        if self.pos + n > len(self.buf):
            raise struct.error("a string runs past the bytes read")
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            if depth >= _MAX_NESTING:
                raise ValueError(f"arrays nested more than {_MAX_NESTING} deep")
            item, count = self.scalar("I"), self.scalar("Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item in _NUMPY:
                dtype = np.dtype(_NUMPY[item]).newbyteorder("<")
                if self.pos + count * dtype.itemsize > len(self.buf):
                    raise struct.error("an array runs past the bytes read")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += arr.nbytes
                return arr.tolist()
            return [self.value(item, depth + 1) for _ in range(count)]
        return self.scalar(_SCALARS[kind])


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF at path; a file that is not one, or is cut inside its header,
    raises ModelLoadError."""
    try:
        with open_model_file(path) as fh:
            return _read(str(path), fh)
    except NewerGGUFError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}", f"upgrade localspec and llama.cpp: {UPGRADE}") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot read {path} as GGUF ({type(exc).__name__}: {exc})", "download the file again"
        ) from exc


def _read(path: str, fh: BinaryIO) -> GGUFHeader:
    size = 1 << 20
    while True:  # the header is read in one piece, growing until it holds every field
        fh.seek(0)
        data = fh.read(size)
        header = header_from_bytes(data, path)
        if header is not None:
            return header
        if len(data) < size:
            raise ValueError("the file ends inside its header")
        size *= 4


def header_from_bytes(data: bytes, where: str) -> GGUFHeader | None:
    """The header at the start of data, or None when data ends inside it (read more); data
    that is not a GGUF raises ValueError."""
    try:
        return _parse(where, _Cursor(data))
    except struct.error:
        return None
    except KeyError as exc:
        raise ValueError(f"unknown GGUF value type {exc}") from exc


def _parse(path: str, cur: _Cursor) -> GGUFHeader:
    if cur.buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    cur.pos = 4
    version = cur.scalar("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    if version not in KNOWN_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big") in KNOWN_VERSIONS
        if not swapped and version > max(KNOWN_VERSIONS):
            raise NewerGGUFError(f"it is GGUF version {version}, newer than the versions this localspec reads (2, 3)")
        note = " (a big-endian GGUF: convert it again for this machine)" if swapped else ""
        raise ValueError(f"GGUF version {version} is not one this reader knows{note}")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.scalar("Q") for _ in range(cur.scalar("I")))
        infos.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
    align = meta.get("general.alignment", 32)
    # An int type (bools are ints in Python), a power of two as GGUF requires: else every
    # offset computed from it would be wrong, or a division by zero.
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment is {align!r}, not a power of two")
    start = (cur.pos + align - 1) // align * align
    tensors = [GGUFTensor(name, dims, qtype, start + offset) for name, dims, qtype, offset in infos]
    return GGUFHeader(path, meta, tensors, start)


def vocab_identity(meta: dict[str, Any], where: str) -> VocabIdentity:
    """The tokenizer a GGUF header declares, as llama.cpp would report it once loaded (a split
    file's first shard holds it); where names the file in the error."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError(f"{where} has no tokenizer (no tokenizer.ggml.tokens)", "use a GGUF converted with one")
    if not isinstance(tokens, list):
        raise ModelLoadError(
            f"{where} has a damaged tokenizer (tokenizer.ggml.tokens is a {type(tokens).__name__}, not a list)",
            "download the file again",
        )
    texts = tuple(str(t).encode() for t in tokens)
    kind = GGUF_TOKENIZER_KINDS.get(str(meta.get("tokenizer.ggml.model")), "none")
    bos, eos = (_token_id(meta, f"tokenizer.ggml.{name}_token_id", where) for name in ("bos", "eos"))
    return VocabIdentity(kind, len(texts), bos, eos, texts)


def _token_id(meta: dict[str, Any], key: str, where: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelLoadError(f"{where} has a damaged tokenizer ({key} is {value!r})", "download the file again")
    return value


def gguf_vocab_identity(path: str | Path) -> VocabIdentity:
    """The tokenizer of the GGUF at path (what the pair check compares)."""
    return vocab_identity(read_header(path).meta, str(path))


# -- opening and checking a file -----------------------------------------------------------

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
            "check the path, or leave the model out to use the embedded default (smollm2-135m)",
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
    blocks = header.meta.get(f"{arch}.block_count")
    for key in ("attention.sliding_window_pattern", "attention.head_count", "feed_forward_length"):
        entries = header.meta.get(f"{arch}.{key}")
        if isinstance(entries, list) and isinstance(blocks, int) and len(entries) != blocks:
            return f"its {arch}.{key} has {len(entries)} entries for its {blocks} blocks"
    if arch is not None:
        return f"its architecture is {arch!r}; this llama.cpp build may not support it"
    return "its header has no general.architecture key"


def assistant_alone(path: str) -> InvalidRequestError:
    """The refusal of an MTP assistant GGUF (Gemma 4's) opened as a model of its own: it
    drafts from inside its target, whose width it was made for."""
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


def load_failure_hint(path: str) -> str:
    """What to do when llama.cpp refused path: upgrade for a newer GGUF version, else fetch it
    again or pick another model."""
    try:
        with open_model_file(path) as fh:
            head = fh.read(8)
    except ModelLoadError:
        head = b""
    version = int.from_bytes(head[4:8], "little") if head[:4] == GGUF_MAGIC and len(head) == 8 else 0
    newer = version > max(KNOWN_VERSIONS) and int.from_bytes(head[4:8], "big") not in KNOWN_VERSIONS
    fix = f"upgrade localspec and llama.cpp: {UPGRADE}" if newer else "download the file again or pick another model"
    return f"{fix}; LOCALSPEC_LLAMA_LOG=1 shows llama.cpp's log"


def check_whole_gguf(path: str | Path) -> None:
    """Refuse a GGUF whose header is damaged or whose tensors run past its end (a cut
    download), before it is registered: reads the header only."""
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
