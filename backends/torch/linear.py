"""The weight matrices of a decoder, each stored the way its device multiplies it fastest.

- Dense: the [out, in] matrix and F.linear (CUDA, half precision, anything not float32 on a CPU).
- Panels: float32 on a CPU, packed in column panels [out/16, in, 16]. Decode and verify steps
  multiply a handful of rows by every weight once, which is bound by memory bandwidth; MKL
  streams an [out, in] matrix for so few rows at about half the bandwidth the machine has
  (BENCHMARKS.md section 9). Short blocks go through native.py's AVX2 kernel, long ones
  (prefill) through a batched matmul over the panels, where MKL is compute-bound and good.
  A matrix whose every value is a half-precision number (an F16 GGUF's) is kept in half
  panels: the kernel widens them exactly, so the products are the float32 ones, from half
  the bytes.
- Int8 / Int4: weight-only int8 (one scale per output row) or 4-bit (group 32) copies, the
  QSpec-style self-drafter's matrices: native.py's int8 kernel or torch's CPU kernels on a
  CPU; elsewhere (CUDA) dequantized to the compute type inside the step, which CUDA graphs
  replay as a few fused kernels.

Each also answers `rows(ids)` (a tied embedding is the output head read by rows) and
`dense()` (the float weight, for deriving a quantized copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from . import native

# Blocks up to this many rows (every decode and verify step) use the AVX2 kernel; longer ones
# (prefill) a batched matmul. On SmolLM2-135M's matrices (2-core EPYC) the kernel streams
# weights near memory speed up to 6 rows and stays ahead of MKL up to 64 on one thread; on
# two, MKL's batched matmul is 5-10% ahead from 8 rows on, and better threaded for prefill.
KERNEL_ROWS = 16
# torch's CPU int4 kernel costs about 2 ms a row for a 1536x576 matrix on a 2-core AVX2 VM
# (~300 ms a token for SmolLM2-135M): a block longer than this (a drafter's prefill, its
# catch-up) widens the codes to float32 once per call and runs one matmul instead.
INT4_KERNEL_ROWS = 1


class Linear(Protocol):
    out_features: int
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> x @ W^T (+ bias) as [n, out]."""
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] as [n, in]: the embedding lookup when the head and the embedding are tied."""
        ...

    def dense(self) -> torch.Tensor:
        """W as an [out, in] float tensor (a view or a fresh copy)."""
        ...


Factory = Callable[[torch.Tensor, torch.Tensor | None], Linear]


class Dense:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    def dense(self) -> torch.Tensor:
        return self.weight


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [ceil(out / 16), in, 16]; zero columns pad the last panel."""
    out, width = weight.shape
    pad = -out % native.PANEL
    if pad:  # the caller cuts them off its output again
        weight = torch.cat([weight, weight.new_zeros(pad, width)])
    return weight.t().reshape(width, -1, native.PANEL).transpose(0, 1).contiguous()


def kernel_matmul(
    kernels: native.Kernels, x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W^T through the native kernel, a longer block KERNEL_ROWS rows at a time (its
    passes over each panel then come from cache); a decode or verify step in one call."""
    if x.shape[0] <= KERNEL_ROWS:
        return kernels.matmul(x.contiguous(), panels, scale)
    return torch.cat([kernels.matmul(part.contiguous(), panels, scale) for part in torch.split(x, KERNEL_ROWS)])


def exactly_half(weight: torch.Tensor) -> bool:
    """Whether every value of a float32 matrix is a float16 number (finite ones only)."""
    half = weight.to(torch.float16)
    return bool(torch.isfinite(half).all()) and torch.equal(half.to(weight.dtype), weight)


class Panels:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.kernels = native.kernels() if weight.dtype == torch.float32 else None
        # Lossless: only a matrix that already is half precision (an F16 file's) is stored so.
        # Decoding reads every weight once per step, so half the bytes is up to half the time.
        if self.kernels is not None and exactly_half(weight):
            weight = weight.to(torch.float16)
        self.panels = to_panels(weight)
        self.bias, self.out_features = bias, int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if self.kernels is not None and (n <= KERNEL_ROWS or self.panels.dtype == torch.float16):
            # Half panels take every block through the kernel: the batched matmul would need a
            # float32 copy of them.
            y = kernel_matmul(self.kernels, x, self.panels)
        else:  # [panels, n, 16] -> [n, out]
            y = torch.bmm(x.expand(self.panels.shape[0], *x.shape), self.panels).transpose(0, 1).reshape(n, -1)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        return y if self.bias is None else y.add_(self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        # Column c of the weight's transpose sits in panel c // 16, lane c % 16.
        return self.panels[ids // native.PANEL, :, ids % native.PANEL].float()

    def dense(self) -> torch.Tensor:
        return self.panels.transpose(0, 1).reshape(self.panels.shape[1], -1)[:, : self.out_features].t().float()


class Int8:
    """Weight-only int8, symmetric, one float scale per output row: W ≈ q · scale. On a CPU in
    int8 column panels for native.py's kernel (a quarter of float32's bytes to stream), else
    in rows for torch's `_weight_int8pack_mm`, which on an AVX2 CPU is 4x slower than float32
    (BENCHMARKS.md section 9) but keeps qspec exact and working everywhere. Off the CPU
    (CUDA) the rows are widened to the input's type for F.linear: half the weight bytes at
    rest, no faster per step (the drafter's speed on a GPU is its launch count, not bytes)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        dtype, weight = weight.dtype, weight.float()
        scale = weight.abs().amax(1).clamp_min(1e-12) / 127.0
        self.q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
        self.on_cpu = weight.is_cpu
        # Off the CPU the scale is kept in the compute type: no cast kernel in every step.
        self.scale, self.bias = (scale if self.on_cpu else scale.to(dtype)).contiguous(), bias
        self.out_features = int(weight.shape[0])
        self.kernels = native.kernels() if self.on_cpu else None
        if self.kernels is not None:
            self.panels = to_panels(self.q)
            self.panel_scale = torch.cat([scale, scale.new_ones(self.panels.shape[0] * native.PANEL - len(scale))])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            # A longer block (the drafter's prefill, or its catch-up after sitting out) goes
            # through the kernel KERNEL_ROWS rows at a time: torch's int8 kernel costs ~60 ms a
            # row here, which made a 165-token prompt's drafter prefill take 10 s, not 0.3 s.
            y = kernel_matmul(self.kernels, x, self.panels, self.panel_scale)[:, : self.out_features]
        elif self.on_cpu:
            y = torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.q, self.scale)
        else:
            y = F.linear(x, self.q.to(x.dtype)) * self.scale
        return y if self.bias is None else y.add_(self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.q[ids].float() * self.scale[ids, None].float()

    def dense(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None].float()


class Int4:
    """Weight-only 4-bit, asymmetric, a scale and offset per group of GROUP inputs of each
    output row. On a CPU, torch's kernel (`_weight_int4pack_mm_for_cpu`) reads the packed
    weight as (q - 8) * scale + zero; elsewhere (CUDA) the codes stay one per byte and are
    widened to the input's type inside the step, as Int8 does."""

    GROUP = 32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        out, width = weight.shape
        if width % self.GROUP:
            raise ValueError(f"int4 needs the input width to be a multiple of {self.GROUP}, got {width}")
        self.on_cpu, dtype = weight.is_cpu, weight.dtype
        pad = -out % 16 if self.on_cpu else 0  # the CPU kernel takes whole 16-row tiles
        weight = torch.cat([weight.float(), weight.new_zeros(pad, width, dtype=torch.float32)])
        groups = weight.reshape(out + pad, width // self.GROUP, self.GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp_min(1e-12)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp_(0, 15)
        if self.on_cpu:
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                q.to(torch.int32).reshape(out + pad, width), 1
            )
            # [groups, out, 2]: the kernel's layout for the scales and the offsets
            self.scales_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous()
            q, scale, low = q[:out], scale[:out], low[:out]
        # The codes one per byte, with scales and offsets in the compute type (no cast kernels
        # in every step): CUDA's path, and the CPU's for blocks of more than INT4_KERNEL_ROWS.
        self.codes, self.scale, self.low = q.to(torch.uint8), scale[..., None].to(dtype), low[..., None].to(dtype)
        self.bias, self.out_features, self.in_features = bias, int(out), int(width)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.on_cpu and x.shape[0] <= INT4_KERNEL_ROWS:
            y: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.contiguous(), self.packed, self.GROUP, self.scales_zeros
            )[:, : self.out_features]
        else:
            y = F.linear(x, self._widened(x.dtype))
        return y if self.bias is None else y.add_(self.bias)

    def _widened(self, dtype: torch.dtype) -> torch.Tensor:
        weight = self.codes.to(dtype) * self.scale + self.low
        return weight.reshape(self.out_features, self.in_features).to(dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense()[ids]

    def dense(self) -> torch.Tensor:
        return self._widened(torch.float32)


def for_device(device: torch.device, dtype: torch.dtype) -> Factory:
    """Panels for float32 on a CPU (where they pay), Dense everywhere else."""
    return Panels if device.type == "cpu" and dtype == torch.float32 else Dense
