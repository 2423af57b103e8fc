"""The weight matrices of a decoder, each stored the way its device multiplies it fastest.

- Dense: the [out, in] matrix and F.linear (CUDA, half precision, anything not float32 on a CPU).
- Panels: float32 on a CPU, packed in column panels [out/16, in, 16]. Decode and verify steps
  multiply a handful of rows by every weight once, which is bound by memory bandwidth; MKL
  streams an [out, in] matrix for so few rows at about half the bandwidth the machine has.
  Short blocks go through native.py's AVX2 kernel, long ones
  (prefill) through a batched matmul over the panels, where MKL is compute-bound and good.
  A matrix whose every value is a half-precision number (an F16 GGUF's) is kept in half
  panels: the kernel widens them exactly, so the products are the float32 ones, from half
  the bytes.
- Int8 / Int4: weight-only int8 (one scale per output row) or 4-bit (group 32): the
  QSpec-style self-drafter's matrices, and a quantized target's on CUDA (a GGUF's blocks
  converted at load time, quantized.py): native.py's int8 kernel or torch's CPU kernels on a
  CPU; on CUDA torch's packed int4 kernel, and int8 rows widened inside the step.

Each also answers `rows(ids)` (a tied embedding is the output head read by rows) and
`dense()` (the float weight, for deriving a quantized copy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from . import native
from .quantized import GROUP, GroupCodes, Matrix, RowCodes, as_float, quantize_groups, quantize_rows

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
    cheap_rows: bool  # whether rows() reads only the rows asked for

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> x @ W^T (+ bias) as [n, out]."""
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] as [n, in]: the embedding lookup when the head and the embedding are tied."""
        ...

    def dense(self) -> torch.Tensor:
        """W as an [out, in] float tensor (a view or a fresh copy)."""
        ...


# Builds one matrix from a float weight or from codes a GGUF was converted into (quantized.py).
Factory = Callable[[Matrix, torch.Tensor | None], Linear]


class Dense:
    cheap_rows = True

    def __init__(self, weight: Matrix, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = as_float(weight), bias
        self.out_features = int(self.weight.shape[0])

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
    cheap_rows = True

    def __init__(self, weight: Matrix, bias: torch.Tensor | None = None) -> None:
        weight = as_float(weight)
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


def has_cuda_kernel(op: str) -> bool:
    """Whether this torch build has a CUDA kernel for aten::op."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA"))


@functools.cache
def packed_int4_works(device: torch.device) -> bool:
    """Whether torch's CUDA int4 kernel runs on this device and computes its codes' values:
    a build may lack the kernel, or an image for this GPU's architecture (it needs sm80+)."""
    if not has_cuda_kernel("_weight_int4pack_mm"):
        return False
    codes = quantize_groups(torch.randn(16, 256, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1))
    try:
        nibbles = (codes.codes[:, ::2] << 4 | codes.codes[:, 1::2]).to(device)
        packed = torch.ops.aten._convert_weight_to_int4pack(nibbles, 8)
        sz = torch.stack([codes.scale, codes.zero], -1).transpose(0, 1).contiguous().to(device, torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm(x.to(device, torch.bfloat16), packed, GROUP, sz).float().cpu()
    except RuntimeError:
        return False
    expected = x @ codes.dequantized().T
    return bool((y - expected).abs().max() < 0.05 * expected.abs().max())


class Int8:
    """Weight-only int8, symmetric, one float scale per output row: W ≈ q · scale. On a CPU in
    int8 column panels for native.py's kernel (a quarter of float32's bytes to stream), else
    in rows for torch's `_weight_int8pack_mm`, which on an AVX2 CPU is 4x slower than float32
    but keeps qspec exact and working everywhere. On CUDA the rows are widened to the input's
    type for F.linear inside the step (a torch.compile'd step fuses the widening into the
    matmul): torch's CUDA `_weight_int8pack_mm` is slower than that at every block size on a
    Hopper GPU, and the more so the longer the block (BENCHMARKS.md, the GPU section)."""

    cheap_rows = True

    def __init__(self, weight: Matrix, bias: torch.Tensor | None = None) -> None:
        codes = weight if isinstance(weight, RowCodes) else quantize_rows(as_float(weight))
        self.q, scale = codes.codes.contiguous(), codes.scale.float()
        self.on_cpu = self.q.is_cpu
        # Off the CPU the scale is kept in the compute type: no cast kernel in every step.
        dtype = weight.dtype if isinstance(weight, torch.Tensor) else torch.bfloat16
        self.scale, self.bias = (scale if self.on_cpu else scale.to(dtype)).contiguous(), bias
        self.out_features = int(self.q.shape[0])
        self.kernels = native.kernels() if self.on_cpu else None
        if self.kernels is not None:
            self.panels = to_panels(self.q)
            self.panel_scale = torch.cat([scale, scale.new_ones(self.panels.shape[0] * native.PANEL - len(scale))])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dtype == torch.float32:
            # A longer block (the drafter's prefill, or its catch-up after sitting out) goes
            # through the kernel KERNEL_ROWS rows at a time: torch's int8 kernel costs ~60 ms a
            # row here, which made a 165-token prompt's drafter prefill take 10 s, not 0.3 s.
            y = kernel_matmul(self.kernels, x, self.panels, self.panel_scale)[:, : self.out_features]
        elif self.on_cpu:
            y = torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.q, self.scale.to(x.dtype))
        else:
            y = F.linear(x, self.q.to(x.dtype)) * self.scale
        return y if self.bias is None else y.add_(self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.q[ids].float() * self.scale[ids, None].float()

    def dense(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None].float()


def inner_k_tiles(width: int) -> int | None:
    """The CUDA int4 kernel's inner tiling for an input width (it needs width % (16·t) == 0)."""
    return next((t for t in (8, 4, 2) if width % (16 * t) == 0), None)


class Int4:
    """Weight-only 4-bit, a scale and zero per group of GROUP inputs of each output row, read
    by torch's kernels as (q - 8) · scale + zero from their packed layout: on a CPU
    `_weight_int4pack_mm_for_cpu` (one-row blocks; longer ones widen the codes to float32
    once per call), on CUDA `_weight_int4pack_mm` (tinygemm, bfloat16: what gpt-fast uses),
    which reads 4.5-5 bits a weight instead of bf16's 16. Where that kernel does not apply
    (no CUDA kernel, an input width it cannot tile) the codes stay one per byte and are
    widened to the input's type inside the step."""

    GROUP = GROUP
    cheap_rows = False

    def __init__(self, weight: Matrix, bias: torch.Tensor | None = None) -> None:
        codes = weight if isinstance(weight, GroupCodes) else quantize_groups(as_float(weight), self.GROUP)
        out, width = codes.codes.shape
        self.group = codes.group
        self.on_cpu = codes.codes.is_cpu
        dtype = weight.dtype if isinstance(weight, torch.Tensor) else torch.float32
        if not self.on_cpu:
            dtype = weight.dtype if isinstance(weight, torch.Tensor) else torch.bfloat16
        self.bias, self.out_features, self.in_features = bias, int(out), int(width)
        tiles = inner_k_tiles(width)
        self.packed_cuda = not self.on_cpu and tiles is not None and packed_int4_works(codes.codes.device)
        if self.on_cpu or self.packed_cuda:
            pad = -out % 16  # the kernels take whole tiles of output rows
            padded = (
                GroupCodes(*(torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in astuple(codes))) if pad else codes
            )
            # [groups, out, 2]: the kernels' layout for the scales and the zeros
            sz = torch.stack([padded.scale, padded.zero], -1).transpose(0, 1).contiguous()
            if self.on_cpu:
                q = padded.codes.to(torch.int32)
                self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
                self.scales_zeros = sz.float()
            else:
                nibbles = (padded.codes[:, ::2] << 4 | padded.codes[:, 1::2]).contiguous()
                self.packed = torch.ops.aten._convert_weight_to_int4pack(nibbles, tiles)
                self.scales_zeros = sz.to(torch.bfloat16)
        if not self.packed_cuda:
            # The codes one per byte, with scales and zeros in the compute type (no cast kernels
            # in every step): the CPU's path for longer blocks, and CUDA's without the kernel.
            self.codes = codes.codes.to(torch.uint8)
            self.scale, self.zero = codes.scale[..., None].to(dtype), codes.zero[..., None].to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor
        if self.packed_cuda:
            wide = x.to(torch.bfloat16)  # the kernel's only input type
            y = torch.ops.aten._weight_int4pack_mm(wide, self.packed, self.group, self.scales_zeros)
            y = y[:, : self.out_features].to(x.dtype)
        elif self.on_cpu and x.shape[0] <= INT4_KERNEL_ROWS:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.contiguous(), self.packed, self.group, self.scales_zeros.to(x.dtype)
            )[:, : self.out_features]
        else:
            y = F.linear(x, self._widened(x.dtype))
        return y if self.bias is None else y.add_(self.bias)

    def _widened(self, dtype: torch.dtype) -> torch.Tensor:
        groups = (self.codes.to(dtype) - 8).view(self.out_features, -1, self.group)
        return (groups * self.scale + self.zero).reshape(self.out_features, self.in_features).to(dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense()[ids]

    def dense(self) -> torch.Tensor:
        if self.packed_cuda:  # the packed layout is the kernel's own: read it back through it
            eye = torch.eye(self.in_features, dtype=torch.bfloat16, device=self.packed.device)
            y: torch.Tensor = torch.ops.aten._weight_int4pack_mm(eye, self.packed, self.group, self.scales_zeros)
            return y[:, : self.out_features].t().float()
        return self._widened(torch.float32)


def astuple(codes: GroupCodes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return codes.codes, codes.scale, codes.zero


def low_bit(device: torch.device) -> Factory:
    """Int4 or Int8 matrices, as their codes say, made on `device` from codes held on the
    host one at a time: a model's unpacked codes (a byte a weight) never sit on the GPU all
    at once. A float matrix reaching it is a tied head read from a float table: int8, as
    quantized.head_kind keeps heads of more than 4 bits."""

    def make(weight: Matrix, bias: torch.Tensor | None) -> Linear:
        if isinstance(weight, GroupCodes):
            return Int4(weight.to(device), bias)
        return Int8(weight if isinstance(weight, torch.Tensor) else weight.to(device), bias)

    return make


def for_device(device: torch.device, dtype: torch.dtype) -> Factory:
    """Panels for float32 on a CPU (where they pay), Dense everywhere else."""
    return Panels if device.type == "cpu" and dtype == torch.float32 else Dense
