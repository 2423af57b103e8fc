"""A GGUF's matrices converted for the GPU's low-bit kernels (quantized.py), kept on disk.

Converting an 8B file takes minutes of numpy; the result depends on nothing but the file's
bytes and the target layout, so it is stored once per (file hash, layout) under the user
directory and read back on later loads. The file's sha256 is itself remembered per
(path, size, modification time), so an unchanged file is not hashed again either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from localspec.store import StoreError, data_dir, file_fingerprint, notice, replace_atomic

from .quantized import Codes, GroupCodes, RowCodes

FORMAT = 1  # bump when the stored layout changes: old entries are then ignored


def cache_dir() -> Path:
    return data_dir() / "converted"


def entry(path: str, kind: str) -> Path:
    return cache_dir() / f"{file_fingerprint(path)[:24]}-{kind}-v{FORMAT}.safetensors"


def load(file: Path) -> dict[str, Codes] | None:
    """The stored conversion, or None when there is none (or it cannot be read)."""
    if not file.exists():
        return None
    from safetensors.torch import load_file

    try:
        flat = load_file(str(file))
    except (OSError, ValueError, RuntimeError):
        return None
    out: dict[str, Codes] = {}
    for name in {key.rsplit(".", 1)[0] for key in flat}:
        if f"{name}.zero" in flat:
            nibbles = flat[f"{name}.codes"].numpy()
            codes = torch.from_numpy(np.stack([nibbles >> 4, nibbles & 15], -1).reshape(nibbles.shape[0], -1))
            out[name] = GroupCodes(codes, flat[f"{name}.scale"], flat[f"{name}.zero"])
        else:
            out[name] = RowCodes(flat[f"{name}.codes"], flat[f"{name}.scale"])
    return out


def save(file: Path, matrices: dict[str, Codes]) -> None:
    """Stored whole or not at all; a full or read-only folder costs converting again next
    time (one notice), never the load."""
    from safetensors.torch import save_file

    flat = dict(_flatten(matrices))

    def fill(fd: int, temporary: Path) -> None:
        save_file(flat, str(temporary))  # safetensors writes by name; the descriptor is fsynced after

    try:
        replace_atomic(file, fill, sum(t.nbytes for t in flat.values()))
    except StoreError as exc:
        notice(f"the converted weights were not saved (converted again next time): {exc.message}; {exc.hint}")


def _flatten(matrices: dict[str, Codes]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, codes in matrices.items():
        if isinstance(codes, GroupCodes):  # two 4-bit codes a byte, as the CUDA packer takes them
            pairs = codes.codes.numpy().reshape(codes.codes.shape[0], -1, 2)
            yield f"{name}.codes", torch.from_numpy(pairs[..., 0] << 4 | pairs[..., 1])
            yield f"{name}.zero", codes.zero.contiguous()
        else:
            yield f"{name}.codes", codes.codes.contiguous()
        yield f"{name}.scale", codes.scale.contiguous()
