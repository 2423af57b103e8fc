"""A GGUF header fuzzer: a valid tiny GGUF (localspec/testing/gguf_writer.py) taken apart into its fields,
mutated (types, counts, lengths, alignment, nesting, versions, tensor descriptions, bytes) and
written back, then opened the ways localspec opens a model. Every outcome must be a header
or a ModelLoadError; any other exception, or a case slower than SLOW_CASE_SECONDS, is a
failure. Shared by tests/robustness/test_gguf_fuzz.py (a fixed seed set) and
benchmarks/fault_injection.py (--gguf-cases, more seeds)."""

from __future__ import annotations

import struct
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from localspec.core.errors import LocalspecError
from localspec.testing.gguf_writer import Spec, write_gguf

SLOW_CASE_SECONDS = 2.0  # a bound, not a timing: a case takes about a millisecond
STRING, ARRAY = 8, 9
SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# Values that break readers: zero, one past a limit, sign bits, all ones.
INTERESTING = (0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 33, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1)


@dataclass
class KV:
    key: str
    vtype: int
    value: Any  # a scalar, a str, or for arrays the list of items
    item: int | None = None  # arrays: the item type
    count: int | None = None  # arrays: the count written (None: the real one)
    length: int | None = None  # strings: the length written (None: the real one)


@dataclass
class Tensor:
    name: str
    dims: list[int]
    qtype: int
    offset: int
    n_dims: int | None = None  # the count written (None: the real one)


@dataclass
class Layout:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes  # the tensor data, after the header's padding
    n_kv: int | None = None  # counts written (None: the real ones)
    n_tensors: int | None = None
    alignment: int = 32


def base_layout(folder: Path) -> Layout:
    """A valid tiny Llama GGUF, as fields."""
    import gguf

    path = write_gguf(Spec("llama", hidden=16, layers=1, heads=2, kv_heads=1, head_dim=8, ffn=16), folder / "base.gguf")
    reader = gguf.GGUFReader(path)
    kvs = []
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [int(t) for t in f.types]
        kvs.append(KV(name, types[0], f.contents(), types[1] if types[0] == ARRAY else None))
    tensors = [Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type), 0) for t in reader.tensors]
    start = min(int(t.data_offset) for t in reader.tensors)
    for tensor, info in zip(tensors, reader.tensors, strict=True):
        tensor.offset = int(info.data_offset) - start
    return Layout(3, kvs, tensors, path.read_bytes()[start:])


# -- encoding -------------------------------------------------------------------------------------


def _string(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def _value(vtype: int, value: Any, item: int | None, count: int | None, depth: int = 0) -> bytes:
    if vtype == STRING:
        return _string(str(value))
    if vtype == ARRAY:
        items = value if isinstance(value, list) else [value]
        item_type = item if item is not None else 4
        head = struct.pack("<IQ", item_type, len(items) if count is None else count)
        return head + b"".join(_value(item_type, v, None, None, depth + 1) for v in items)
    code = SCALAR_CODES.get(vtype)
    if code is None:
        return struct.pack("<I", 0)  # an unknown type: whatever bytes follow
    try:
        return struct.pack("<" + code, value)
    except (struct.error, TypeError):
        return struct.pack("<" + code, 0 if code not in "fd" else 0.0)


def _kv(kv: KV) -> bytes:
    if kv.vtype == STRING and kv.length is not None:
        return _string(kv.key) + struct.pack("<I", kv.vtype) + _string(str(kv.value), kv.length)
    return _string(kv.key) + struct.pack("<I", kv.vtype) + _value(kv.vtype, kv.value, kv.item, kv.count)


def _tensor(t: Tensor) -> bytes:
    n_dims = len(t.dims) if t.n_dims is None else t.n_dims
    dims = b"".join(struct.pack("<Q", d % 2**64) for d in t.dims)
    return _string(t.name) + struct.pack("<I", n_dims % 2**32) + dims + struct.pack("<IQ", t.qtype % 2**32, t.offset)


def encode(layout: Layout) -> bytes:
    n_kv = len(layout.kvs) if layout.n_kv is None else layout.n_kv
    n_tensors = len(layout.tensors) if layout.n_tensors is None else layout.n_tensors
    head = b"GGUF" + struct.pack("<IQQ", layout.version % 2**32, n_tensors % 2**64, n_kv % 2**64)
    body = head + b"".join(_kv(kv) for kv in layout.kvs) + b"".join(_tensor(t) for t in layout.tensors)
    pad = -len(body) % max(layout.alignment, 1)
    return body + bytes(pad) + layout.data


# -- mutations: each takes the valid layout and a generator, returns the file's bytes ---------------


def _pick(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _interesting(rng: np.random.Generator) -> int:
    return int(_pick(rng, list(INTERESTING)))


def retype(layout: Layout, rng: np.random.Generator) -> bytes:
    kv = _pick(rng, layout.kvs)
    kv.vtype = int(rng.integers(0, 16))
    return encode(layout)


def retype_items(layout: Layout, rng: np.random.Generator) -> bytes:
    kv = _pick(rng, [k for k in layout.kvs if k.vtype == ARRAY])
    kv.item = int(rng.integers(0, 16))
    return encode(layout)


def recount(layout: Layout, rng: np.random.Generator) -> bytes:
    kv = _pick(rng, [k for k in layout.kvs if k.vtype == ARRAY])
    kv.count = _interesting(rng) if rng.random() < 0.7 else len(kv.value) + int(rng.integers(-2, 3))
    kv.count = max(kv.count, 0)
    return encode(layout)


def relength(layout: Layout, rng: np.random.Generator) -> bytes:
    kv = _pick(rng, [k for k in layout.kvs if k.vtype == STRING])
    kv.length = _interesting(rng)
    return encode(layout)


def counts(layout: Layout, rng: np.random.Generator) -> bytes:
    if rng.random() < 0.5:
        layout.n_kv = _interesting(rng)
    else:
        layout.n_tensors = _interesting(rng)
    return encode(layout)


def version(layout: Layout, rng: np.random.Generator) -> bytes:
    layout.version = int(_pick(rng, [0, 1, 2, 4, 5, 0x02000000, 0x03000000, 2**32 - 1]))
    return encode(layout)


def alignment(layout: Layout, rng: np.random.Generator) -> bytes:
    vtype = int(_pick(rng, [4, 4, 4, 10, 5, 11, 6, 7, STRING, ARRAY]))
    value: Any = _pick(rng, [0, 1, 3, 24, 33, 64, 2**31, 2**32 - 1, -1, -32])
    if vtype == STRING:
        value = str(value)
    elif vtype == 6:
        value = float(_pick(rng, [0.0, 0.5, float("inf"), float("nan"), 32.0]))
    elif vtype in (4, 10):
        value %= 2 ** (32 if vtype == 4 else 64)
    layout.kvs = [k for k in layout.kvs if k.key != "general.alignment"]
    layout.kvs.insert(int(rng.integers(len(layout.kvs) + 1)), KV("general.alignment", vtype, value, 4))
    return encode(layout)


def nesting(layout: Layout, rng: np.random.Generator) -> bytes:
    depth = int(_pick(rng, [2, 3, 9, 100, 2000, 20000]))
    nested: bytes = struct.pack("<IQ", 4, 0)  # an empty array of u32
    for _ in range(depth - 1):
        nested = struct.pack("<IQ", ARRAY, 1) + nested
    raw = _string("fuzz.nested") + struct.pack("<I", ARRAY) + nested
    head, rest = _split_after_counts(encode(layout))
    n_tensors, n_kv = struct.unpack_from("<QQ", head, 8)
    return head[:8] + struct.pack("<QQ", n_tensors, n_kv + 1) + raw + rest


def _split_after_counts(data: bytes) -> tuple[bytes, bytes]:
    return data[:24], data[24:]


def tensors(layout: Layout, rng: np.random.Generator) -> bytes:
    t = _pick(rng, layout.tensors)
    what = int(rng.integers(4))
    if what == 0:
        t.n_dims = _interesting(rng)
    elif what == 1:
        t.dims[int(rng.integers(len(t.dims)))] = _interesting(rng)
    elif what == 2:
        t.qtype = int(_pick(rng, [4, 5, 31, 40, 41, 100, 2**31, 2**32 - 1]))
    else:
        t.offset = _interesting(rng)
    return encode(layout)


def tokenizer(layout: Layout, rng: np.random.Generator) -> bytes:
    key = _pick(rng, ["tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"])
    kv = next(k for k in layout.kvs if k.key == key)
    kv.vtype, kv.item, kv.value = _pick(rng, [(4, None, 7), (STRING, None, "x"), (ARRAY, 4, [1, 2]), (7, None, True)])
    return encode(layout)


def keys(layout: Layout, rng: np.random.Generator) -> bytes:
    kv = _pick(rng, layout.kvs)
    kv.key = _pick(
        rng, ["", layout.kvs[0].key, "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"), "k" * 5000]
    )
    return encode(layout)


def flip_bytes(layout: Layout, rng: np.random.Generator) -> bytes:
    data = bytearray(encode(layout))
    header_end = len(data) - len(layout.data)
    for _ in range(int(rng.integers(1, 9))):
        data[int(rng.integers(4, header_end))] = int(rng.integers(256))
    return bytes(data)


def poke(layout: Layout, rng: np.random.Generator) -> bytes:
    data = bytearray(encode(layout))
    header_end = len(data) - len(layout.data)
    at, width = int(rng.integers(4, header_end - 8)), int(_pick(rng, [4, 8]))
    data[at : at + width] = (_interesting(rng) % 2 ** (8 * width)).to_bytes(width, "little")
    return bytes(data)


def truncate(layout: Layout, rng: np.random.Generator) -> bytes:
    data = encode(layout)
    return data[: int(rng.integers(0, len(data) - len(layout.data) + 64))]


Mutation = Callable[[Layout, np.random.Generator], bytes]
MUTATIONS: dict[str, Mutation] = {
    "types": retype,
    "array item types": retype_items,
    "array counts": recount,
    "string lengths": relength,
    "key and tensor counts": counts,
    "versions": version,
    "alignment": alignment,
    "nesting": nesting,
    "tensor descriptions": tensors,
    "tokenizer fields": tokenizer,
    "keys": keys,
    "random bytes": flip_bytes,
    "random integers": poke,
    "truncation": truncate,
}


# -- running ------------------------------------------------------------------------------------


@dataclass
class FuzzResult:
    tried: dict[str, int] = field(default_factory=dict)
    refused: int = 0  # cases that ended in a ModelLoadError (the rest read as headers)
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0


def open_like_localspec(path: Path) -> None:
    """What localspec does with a model file before a backend loads it: the magic check, the
    header, the tokenizer (the pair check), the diagnosis of a failed load."""
    from localspec.common.gguf_header import check_gguf, diagnose_gguf, read_header, vocab_identity

    check_gguf(str(path))
    diagnosis = diagnose_gguf(str(path))
    assert isinstance(diagnosis, str) and diagnosis
    header = read_header(path)
    vocab_identity(header.meta, str(path))


def fuzz(seeds: range, folder: Path | None = None) -> FuzzResult:
    """One mutated file per seed (the seed picks the mutation and its values)."""
    work = Path(folder or tempfile.mkdtemp(prefix="gguf-fuzz-"))
    base = base_layout(work)
    names = list(MUTATIONS)
    result = FuzzResult()
    path = work / "case.gguf"
    for seed in seeds:
        rng = np.random.default_rng(seed)
        name = names[seed % len(names)]
        layout = _copy(base)
        path.write_bytes(MUTATIONS[name](layout, rng))
        result.tried[name] = result.tried.get(name, 0) + 1
        started = time.perf_counter()
        try:
            open_like_localspec(path)
        except LocalspecError:
            result.refused += 1
        except BaseException as exc:  # a fuzzer records whatever escapes
            if isinstance(exc, KeyboardInterrupt):
                raise
            where = traceback.extract_tb(exc.__traceback__)[-1]
            at = f"{Path(where.filename).name}:{where.lineno}"
            result.failures.append(f"seed {seed} ({name}): {type(exc).__name__}: {str(exc)[:120]} at {at}")
        took = time.perf_counter() - started
        result.slowest = max(result.slowest, took)
        if took > SLOW_CASE_SECONDS:
            result.failures.append(f"seed {seed} ({name}): took {took:.1f} s")
    return result


def _copy(layout: Layout) -> Layout:
    kvs = [replace(kv, value=list(kv.value) if isinstance(kv.value, list) else kv.value) for kv in layout.kvs]
    return replace(layout, kvs=kvs, tensors=[replace(t, dims=list(t.dims)) for t in layout.tensors])
