"""Self-drafters derived from a llama.cpp target with llama.cpp's own quantize call: a
low-bit copy (qspec), or a copy with transformer blocks left out through quantize's prune
list (layerskip). Each is made once per target file and reused from the user directory."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.common.gguf_header import SPLIT_GGUF, check_gguf, quantized_bytes, read_header
from localspec.common.progress import reporter
from localspec.control.hardware import physical_cores
from localspec.control.selfdraft import layerskip_blocks
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.store import data_dir, file_fingerprint, why_not_writable

if TYPE_CHECKING:
    from localspec.core.protocol import Backend

# llama_ftype values (llama.h)
FTYPES = {
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q2_K": 10,
    "Q3_K_M": 12,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
}
# general.file_type -> the type name quantize takes, for keeping a target's type.
FILE_TYPES = {v: k for k, v in FTYPES.items()} | {0: "F16"}
QSPEC_TYPES = ("Q4_0", "Q3_K_M", "Q2_K")
# `bench -s qspec:all` also measures the near-lossless types, to show where acceptance stops
# paying for their cost.
QSPEC_SWEEP = ("Q8_0", "Q4_K_M", *QSPEC_TYPES)


@dataclass(frozen=True)
class Candidate:
    label: str  # what the user would type after the colon
    ftype: str
    prune: tuple[int, ...] = ()


def candidates(kind: str, option: str | None, n_layers: int, target_ftype: str) -> list[Candidate]:
    if kind == "qspec":
        if option is None:
            return [Candidate(t, t) for t in QSPEC_TYPES]
        if option not in FTYPES:
            raise InvalidRequestError(
                f"unknown low-bit type {option!r} for qspec", f"choose one of: {', '.join(FTYPES)}"
            )
        return [Candidate(option, option)]
    keep = layerskip_blocks(option, n_layers)
    if keep is not None:
        return [Candidate(str(keep), target_ftype, tuple(range(keep, n_layers)))]
    out = [Candidate(str(k), target_ftype, tuple(range(k, n_layers))) for k in (n_layers // 2, (3 * n_layers) // 4)]
    # Training-free layer skipping: drop every other block in the middle half.
    middle = tuple(range(n_layers // 4 + 1, (3 * n_layers) // 4, 2))
    out.append(Candidate(f"skip-middle-{len(middle)}", target_ftype, middle))
    return out


def derived_home(target: Backend) -> tuple[Path, str]:
    """Where drafters derived from target live, and the target's own quantization type."""
    folder = data_dir() / "derived" / file_fingerprint(target.info.path)[:16]
    return folder, FILE_TYPES.get(int(target.capabilities.extra.get("file_type", "1")), "F16")


def derived(source: str | Path, ftype: str, folder: str | Path, prune_layers: Sequence[int] = ()) -> Path:
    """source at ftype (minus pruned blocks) inside folder, made once and reused."""
    tag = f".skip{'-'.join(map(str, sorted(set(prune_layers))))}" if prune_layers else ""
    split = SPLIT_GGUF.match(Path(source).name)  # llama.cpp reads a split model through its first shard
    stem = split["prefix"] if split else Path(source).stem
    dest = Path(folder) / f"{stem}{tag}.{ftype}.gguf"
    return dest if dest.exists() else quantize(source, dest, ftype, prune_layers)


def quantize(source: str | Path, dest: str | Path, ftype: str, prune_layers: Sequence[int] = ()) -> Path:
    """Write source requantized to ftype at dest (atomically), leaving out the transformer
    blocks in prune_layers (llama.cpp renumbers the rest); returns dest."""
    import llama_cpp as llama

    from .library import init_library

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
    with _written(partial, source, ftype, prune_layers):
        rc = llama.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
    if rc != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        why = quantize_failure_cause(str(source), str(dest), ftype, prune_layers)
        raise ModelLoadError(
            f"llama.cpp could not quantize {source} to {ftype} (code {rc})" + (f": {why}" if why else ""),
            "free some space or pick another strategy; LOCALSPEC_LLAMA_LOG=1 shows llama.cpp's log",
        )
    if prune_layers:
        fit_pruned_blocks(partial, read_header(source).meta, prune_layers)
    os.replace(partial, dest)
    return dest


@contextlib.contextmanager
def _written(partial: Path, source: str | Path, ftype: str, prune_layers: Sequence[int]) -> Iterator[None]:
    """While llama.cpp writes partial, report how much of it is there (llama.cpp itself says
    nothing while a requantization runs, which takes minutes for a large model)."""
    say, done = reporter(), threading.Event()
    try:
        total = f" of about {quantized_bytes(str(source), ftype, prune_layers) / 2**20:.0f}"
    except (ModelLoadError, KeyError, ValueError):
        total = ""

    def watch() -> None:
        say(f"writing a {ftype} copy of the model")
        while not done.wait(1.0):
            with contextlib.suppress(OSError):
                say(f"writing a {ftype} copy of the model, {partial.stat().st_size / 2**20:.0f}{total} MiB written")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def fit_pruned_blocks(path: Path, source: dict[str, Any], pruned: Sequence[int]) -> None:
    """Make a copy with blocks left out describe the blocks it keeps. llama.cpp's prune
    renumbers the blocks and sets block_count but leaves every other per-block entry as the
    full model had it: Gemma's sliding-window pattern (one flag per block), per-block head
    counts, Gemma 4's count of trailing blocks that share earlier ones' keys. A tensor only
    left-out blocks read (Gemma 4's rope_freqs, read by full-attention blocks) goes too:
    llama.cpp refuses a file with a tensor it does not load. Rewrites `path` when needed."""
    import gguf

    arch = str(source.get("general.architecture", ""))
    n_layers = int(source.get(f"{arch}.block_count", 0) or 0)
    kept = [i for i in range(n_layers) if i not in set(pruned)]
    changes: dict[str, Any] = {}
    for key, value in source.items():
        if key.startswith(f"{arch}.") and isinstance(value, list) and len(value) == n_layers:
            changes[key] = [value[i] for i in kept]
    shared = int(source.get(f"{arch}.attention.shared_kv_layers", 0) or 0)
    if shared:
        changes[f"{arch}.attention.shared_kv_layers"] = sum(1 for i in kept if i >= n_layers - shared)
    pattern = changes.get(f"{arch}.attention.sliding_window_pattern")
    drop = {"rope_freqs.weight"} if arch == "gemma4" and pattern is not None and all(pattern) else set()
    if not changes and not drop:
        return
    reader = gguf.GGUFReader(path)
    fitted = path.with_name(path.name + ".fit")
    writer = gguf.GGUFWriter(fitted, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, changes.get(key, field.contents()), vtype, sub_type=sub)
    tensors = [t for t in reader.tensors if t.name not in drop]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    del reader, tensors
    os.replace(fitted, path)


def quantize_failure_cause(source: str, dest: str, ftype: str, prune_layers: Sequence[int] = ()) -> str | None:
    """Why writing source requantized to ftype at dest failed, when it shows from outside
    llama.cpp (which returns only an exit code): a read-only folder or a disk too full."""
    try:
        needed = quantized_bytes(source, ftype, prune_layers)
    except (ModelLoadError, KeyError, ValueError):
        needed = os.path.getsize(source)  # the source's own size: near it for same-precision copies
    return why_not_writable(os.path.dirname(os.path.abspath(dest)), needed)
