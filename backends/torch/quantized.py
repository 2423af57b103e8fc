"""Low-bit matrices as codes plus scales, before a device packs them: GGUF blocks converted
into the two layouts torch's weight-only kernels read, and what a model takes in them.

- GroupCodes: 4-bit, W[r, c] = (codes[r, c] - 8) · scale[r, c // g] + zero[r, c // g], the
  layout of `_weight_int4pack_mm` (CUDA, bf16 scales) and `_weight_int4pack_mm_for_cpu`.
- RowCodes: int8, W[r, c] = codes[r, c] · scale[r], the layout of `_weight_int8pack_mm`.

What converting each GGUF type costs (the codes are read from the file with the gguf
package's own dequantizer, probed with unit scales, so no bit layout is restated here):

    GGUF type   -> int4 (group 32)                          -> int8 (one scale per row)
    Q4_0        exact: codes and scales carried over        re-quantized
    Q4_1        codes and scales exact; zero = m + 8·d is    re-quantized
                rounded once in float32
    Q4_K        codes and scales (d·sc, exact in float32)    re-quantized
                exact; zero = 8·d·sc - dmin·m rounded once
    Q5_K, Q6_K  re-quantized (5 and 6 bits into 4)          re-quantized
    Q8_0        re-quantized                                re-quantized (32-value blocks
                                                            share one row scale)
    other       re-quantized from the dequantized values    re-quantized

The output head is the exception: a file that stores it in more than 4 bits (most do, and
llama.cpp's Q4_K_M keeps it in Q6_K) has it converted into int8, not int4, since squeezing
the head into 4 bits costs far more perplexity than all the blocks do (requant_perplexity.py).

On CUDA the int4 kernel takes its scales and zeros in bfloat16, which keeps 8 significant
bits of each: there even the exact rows above are re-quantized, by at most 2^-9 of each
scale and zero. On the CPU (float32 scales) they are exact. The int8 kernel has one scale
per row, so a GGUF type with a scale per block of 32 never converts into it exactly.
`benchmarks/requant_perplexity.py` measures what the re-quantizing rows cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .config import ModelConfig

GROUP = 32  # GGUF's block (and K-quant sub-block) width: the finest group the kernels take
F32, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K = 0, 2, 3, 8, 12, 13, 14  # gguf.GGMLQuantizationType
EXACT_INT4 = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q4_K: "Q4_K"}
KINDS = ("int4", "int8")


@dataclass
class GroupCodes:
    """4-bit codes (uint8, one per byte, 0..15) with float32 scale and zero per group."""

    codes: torch.Tensor  # [out, in]
    scale: torch.Tensor  # [out, in // group]
    zero: torch.Tensor

    @property
    def group(self) -> int:
        return int(self.codes.shape[1] // self.scale.shape[1])

    def dequantized(self) -> torch.Tensor:
        out, width = self.codes.shape
        groups = (self.codes.float() - 8).view(out, -1, self.group)
        return (groups * self.scale[..., None] + self.zero[..., None]).view(out, width)

    def to(self, device: torch.device) -> GroupCodes:
        return GroupCodes(self.codes.to(device), self.scale.to(device), self.zero.to(device))


@dataclass
class RowCodes:
    """int8 codes with one float32 scale per output row (symmetric)."""

    codes: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out]

    def dequantized(self) -> torch.Tensor:
        return self.codes.float() * self.scale[:, None]

    def to(self, device: torch.device) -> RowCodes:
        return RowCodes(self.codes.to(device), self.scale.to(device))


Codes = GroupCodes | RowCodes
Matrix = torch.Tensor | GroupCodes | RowCodes


def as_float(weight: Matrix) -> torch.Tensor:
    """The matrix's values as a tensor (codes dequantized to float32)."""
    return weight if isinstance(weight, torch.Tensor) else weight.dequantized()


def concatenated(parts: list[Matrix]) -> Matrix:
    """Matrices stacked by rows (fused projections); codes stay codes when all parts agree."""
    if all(isinstance(p, GroupCodes) for p in parts):
        groups = [p for p in parts if isinstance(p, GroupCodes)]
        if len({g.group for g in groups}) == 1:
            return GroupCodes(*(torch.cat([getattr(g, f) for g in groups]) for f in ("codes", "scale", "zero")))
    if all(isinstance(p, RowCodes) for p in parts):
        rows = [p for p in parts if isinstance(p, RowCodes)]
        return RowCodes(torch.cat([r.codes for r in rows]), torch.cat([r.scale for r in rows]))
    return torch.cat([as_float(p) for p in parts], 0).contiguous()


# -- from float -------------------------------------------------------------------------------


def quantize_groups(weight: torch.Tensor, group: int = GROUP) -> GroupCodes:
    """Asymmetric min/max 4-bit quantization per group of `group` inputs."""
    out, width = weight.shape
    if width % group:
        raise ValueError(f"int4 needs the input width to be a multiple of {group}, got {width}")
    groups = weight.float().reshape(out, width // group, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-12)
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp_(0, 15)
    return GroupCodes(codes.to(torch.uint8).reshape(out, width), scale, low + 8 * scale)


def quantize_rows(weight: torch.Tensor) -> RowCodes:
    """Symmetric int8 quantization with one scale per output row."""
    weight = weight.float()
    scale = weight.abs().amax(1).clamp_min(1e-12) / 127.0
    codes = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return RowCodes(codes.contiguous(), scale)


# -- from GGUF blocks -------------------------------------------------------------------------

Array = npt.NDArray[Any]
_HALF_ONE = np.array([1.0], dtype=np.float16).view(np.uint8)


def _dequantize(blocks: Array, qtype: int, rows: int) -> Array:
    import gguf

    return np.asarray(gguf.quants.dequantize(blocks.reshape(rows, -1), gguf.GGMLQuantizationType(qtype)))


def _half(blocks: Array, at: int) -> Array:
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16)[:, 0].astype(np.float32)


def exact_group_codes(raw: Array, qtype: int, rows: int) -> GroupCodes | None:
    """The file's own 4-bit codes and scales of a Q4_0 / Q4_1 / Q4_K matrix (raw: its bytes,
    [rows, bytes per row]); None for other types. The codes are what the gguf dequantizer
    gives once every block's scale is set to 1 and its offset to 0."""
    if qtype not in EXACT_INT4:
        return None
    import gguf

    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)][1]
    blocks = raw.reshape(-1, size)
    probe = blocks.copy()
    probe[:, 0:2] = _HALF_ONE  # d = 1
    if qtype == Q4_1:
        probe[:, 2:4] = 0  # m = 0
    if qtype == Q4_K:
        probe[:, 2:4] = 0  # dmin = 0
        # Twelve bytes of 6-bit scales and mins: every scale 1, every min 0.
        probe[:, 4:16] = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], dtype=np.uint8)
    values = _dequantize(probe, qtype, rows)
    codes = values + 8 if qtype == Q4_0 else values
    d = _half(blocks, 0)
    if qtype == Q4_0:
        scale, zero = d, np.zeros_like(d)
    elif qtype == Q4_1:
        scale, zero = d, _half(blocks, 2) + 8 * d
    else:
        sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
        scale = (d[:, None] * sc.astype(np.float32)).reshape(-1)
        zero = (8 * scale.reshape(-1, 8) - _half(blocks, 2)[:, None] * m.astype(np.float32)).reshape(-1)
    return GroupCodes(
        torch.from_numpy(codes.astype(np.uint8)),
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(rows, -1)),
        torch.from_numpy(np.ascontiguousarray(zero, dtype=np.float32).reshape(rows, -1)),
    )


def head_kind(kind: str, qtype: int) -> str:
    """The layout of the output head in a `kind` model: int8 unless the file's head is 4-bit."""
    return "int8" if kind == "int4" and qtype not in EXACT_INT4 else kind


def convert(raw: Array, qtype: int, rows: int, kind: str) -> Codes:
    """One GGUF matrix (its raw bytes) as the codes of `kind` ("int4" or "int8")."""
    if kind == "int4":
        exact = exact_group_codes(raw, qtype, rows)
        if exact is not None:
            return exact
    weight = torch.from_numpy(np.array(_dequantize(raw, qtype, rows), dtype=np.float32))
    return quantize_groups(weight) if kind == "int4" else quantize_rows(weight)


# -- memory -----------------------------------------------------------------------------------


def matrix_bytes(out: int, width: int, kind: str, scale_bytes: int = 2, group: int = GROUP) -> int:
    """Bytes of one [out, width] matrix on the device: packed codes plus their scales."""
    if kind == "int4":
        return out * width // 2 + 2 * out * (width // group) * scale_bytes
    if kind == "int8":
        return out * width + out * scale_bytes
    return out * width * scale_bytes  # dense in the compute type


def model_bytes(config: ModelConfig, kind: str, tied: bool, dtype_bytes: int = 2, head: str | None = None) -> int:
    """What a model's weights take on the device in `kind` ("int4", "int8" or "dense"), before
    its KV cache: every block's matrices in `kind`, the output head in `head` (default:
    `kind`), the embedding table and the norms in the compute type (a tied low-bit head also
    keeps a dense embedding table)."""
    c = config
    q_rows = c.n_heads * c.head_dim
    kv_rows = c.n_kv_heads * c.head_dim
    per_layer = (
        matrix_bytes(q_rows + 2 * kv_rows, c.hidden, kind, dtype_bytes)
        + matrix_bytes(c.hidden, q_rows, kind, dtype_bytes)
        + matrix_bytes(2 * c.ffn, c.hidden, kind, dtype_bytes)
        + matrix_bytes(c.hidden, c.ffn, kind, dtype_bytes)
        + 2 * c.hidden * dtype_bytes
    )
    head_bytes = matrix_bytes(c.vocab_size, c.hidden, head or kind, dtype_bytes)
    embedding = c.vocab_size * c.hidden * dtype_bytes
    if tied and kind == "dense":
        embedding = 0  # the head's own matrix is read by rows
    return c.n_layers * per_layer + head_bytes + embedding + c.hidden * dtype_bytes


def kv_cache_bytes(config: ModelConfig, n_ctx: int, dtype_bytes: int = 2) -> int:
    return 2 * config.n_layers * config.n_kv_heads * n_ctx * config.head_dim * dtype_bytes
