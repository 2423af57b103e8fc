"""Which of llama.cpp's CPU kernels a model runs with, chosen so a verify block gets the
logits of one-token passes wherever that is cheap, and what stays inexact otherwise.

Five CPU kernels sum a block's rows in another order than a one-token pass
(benchmarks/pages/exactness.md): ggml's tiled K-quant matmul (8+ rows), repacked K-quant
weights (4+ rows), llamafile's tinyBLAS (2+ rows of F16/F32 products), flash attention's
tiled kernel (64+ query rows) and its split over the cache (one query past 256 cells, 2+
threads). Each switches at the same row count on AVX2 and AVX-512 (VNNI, BF16) builds; only
which near-ties tip differs between them. By default a model whose file has K-quant tensors
loads them unrepacked and verifies a block of 8+ tokens in pieces of 7, so prefill keeps the
tiled kernel and every verify block sums as plain decoding does; what is left is said in an
Exactness, prompt blocks included (a cached prefix reused from decode steps against a fresh
prefill). `--exact` turns all of them off (use_exact_kernels).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from localspec.common.gguf_header import read_header
from localspec.control.hardware import physical_cores
from localspec.core.errors import ModelLoadError
from localspec.core.protocol import BLOCK_KERNEL_ROWS, Exactness

from .library import FLASH_ATTN, batch_invariant_build, extra_buffers, flash_attention

# ggml type ids (ggml.h) of the weights ggml's tiled matmul takes from 8 rows (tiled.cpp).
TILED_TYPES = frozenset({10, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 29})  # Q2_K..Q6_K, IQ*
TILED_ROWS = 8
UNBOUNDED_ROWS = 1 << 16  # a pass no kernel switch bounds: a ubatch still does
# Types ggml-cpu repacks (on x86: Q4_K; Q2_K with AVX-512; Q5_K and Q6_K on ARM) into a
# layout whose kernel for 4+ rows sums in another order than the one-row kernel (measured on
# Q4_K; the others assumed alike, IQ4_NL included). Q4_0 repacks too and measured the same
# order as one row (BENCHMARKS.md §2c).
REPACKED_PARTING = frozenset({10, 12, 13, 14, 20})
# F32, F16, BF16: weights llamafile's tinyBLAS multiplies from 2 rows.
FLOAT_TYPES = frozenset({0, 1, 30})
# The matrices a pass multiplies are the 2-D tensors but these: a recurrent layer's convolution
# kernel (Mamba's, Qwen3.5's Gated DeltaNet), kept F32 in quantized files, feeds ggml_ssm_conv,
# a per-channel sum no matmul kernel takes.
CONV_WEIGHTS = "ssm_conv1d.weight"
# Verify blocks (a draft and the token before it) are split up to this size; longer blocks
# (prefill, agreement measurements) keep the fast kernels. Flash attention's own tiled path
# starts at 64 query rows too.
SPLIT_BLOCKS_UP_TO = 64
# Flash attention's CPU kernel takes a block of this many query rows or more in tiles, in F32
# where a one-token pass rounds the query and the weighted sum to F16 (ggml-cpu ops.cpp).
FLASH_TILED_ROWS = 64
# llama.cpp pads the cache view to 256 cells; flash attention splits a single query over a
# view of 512+ cells, so a one-token pass splits once the context passes 256 tokens.
FLASH_SPLIT_AFTER = 256


@dataclass(frozen=True)
class KernelPlan:
    repack: bool  # weights in repacked layouts (extra buffer types)
    max_rows: int | None  # a verify block goes through llama_decode in pieces of at most this
    exactness: Exactness


@dataclass(frozen=True)
class KernelSettings:
    """What the kernels a model runs with depend on besides its tensors' types."""

    exact: bool  # --exact: every kernel that parts from one-token passes off
    llamafile: bool  # the build has llamafile's tinyBLAS
    flash: bool  # flash attention on
    threads: int
    repack: bool  # llama.cpp's default here: weights in repacked layouts
    repack_forced: bool  # the user asked for them (LLAMA_ARG_REPACK)
    stateful: bool  # a recurrent or hybrid model, whose verify block must stay one ubatch
    offloaded: bool  # a GPU or RPC split: device kernels


def kernel_plan(tensor_types: Iterable[int], settings: KernelSettings) -> KernelPlan:
    """The kernels a model whose matrices have these types runs with, and what stays inexact."""
    s, repack = settings, settings.repack
    if s.offloaded:
        why = "a GPU or RPC split runs llama.cpp's device kernels, not checked for this"
        return KernelPlan(repack, None, Exactness(0, why, prompt_rows=0, prompt_why=why))
    if s.exact:
        return KernelPlan(False, None, Exactness(None))
    types = set(tensor_types)
    prompt_rows, prompt_why = prompt_block_limit(types, llamafile=s.llamafile, flash=s.flash)
    limits: list[tuple[int, str]] = []  # (context length it holds to, why)
    if repack and types & REPACKED_PARTING:
        if s.repack_forced:
            limits.append((0, "repacked K-quant weights (LLAMA_ARG_REPACK=1) take another kernel for 4+ rows"))
        else:
            repack = False
    max_rows = None
    if types & TILED_TYPES:
        if s.stateful:
            limits.append((0, "ggml's tiled K-quant matmul takes verify blocks of 8+ tokens"))
        else:
            max_rows = TILED_ROWS - 1
    if s.llamafile and types & FLOAT_TYPES:
        limits.append((0, "llamafile's tinyBLAS multiplies float weights by 2+ rows in another order"))
    if s.flash and s.threads > 1:
        limits.append((FLASH_SPLIT_AFTER, "flash attention splits a one-token pass over a context past 256 tokens"))
    elif not s.flash and s.llamafile:
        limits.append((0, "with flash attention off, llamafile's tinyBLAS takes attention of 2+ rows"))
    rows = SPLIT_BLOCKS_UP_TO if max_rows else None
    cells, why = min(limits) if limits else (None, "")
    # Every kernel switch above happens below BLOCK_KERNEL_ROWS rows, so blocks of that many or
    # more all take the tiled kernels, which compute each row alone (block_probe, each host
    # kind); a recurrent layer's scan is not checked for it.
    pieces = None if s.stateful else BLOCK_KERNEL_ROWS
    exactness = Exactness(cells, why, rows, prompt_rows, prompt_why, pieces_from=pieces)
    return KernelPlan(repack, max_rows, exactness)


def prompt_block_limit(types: set[int], *, llamafile: bool, flash: bool) -> tuple[int | None, str]:
    """The most rows a block (a prompt's, evaluated whole) may have and still give one-token
    passes' logits, with the kernel that takes over past it; (None, "") where none does. A
    repacked K-quant is never kept by default (kernel_plan), so it is not weighed here."""
    limits: list[tuple[int, str]] = []
    if flash:
        limits.append(
            (FLASH_TILED_ROWS - 1, f"flash attention's tiled kernel takes blocks of {FLASH_TILED_ROWS}+ tokens")
        )
    if types & TILED_TYPES:
        limits.append((TILED_ROWS - 1, f"ggml's tiled K-quant matmul takes blocks of {TILED_ROWS}+ tokens"))
    if llamafile and (types & FLOAT_TYPES or not flash):
        limits.append((1, "llamafile's tinyBLAS takes products of 2+ rows"))
    return min(limits) if limits else (None, "")


def one_token_rows(path: str, offloaded: bool) -> int:
    """The most rows a pass over the model file at path may hold and still give each row its
    one-token pass's logits, on this llama.cpp (a device's: as many as asked, its load check
    bounds them). Where no kernel takes over, as many as a ubatch can hold."""
    if offloaded:
        return UNBOUNDED_ROWS
    rows, _ = prompt_block_limit(
        set(matrix_types(path)), llamafile=not batch_invariant_build(), flash=flash_attention() != FLASH_ATTN["off"]
    )
    return max(rows, 1) if rows is not None else UNBOUNDED_ROWS


def matrix_types(path: str) -> frozenset[int]:
    """The ggml types of the matrices a pass over the model file at path multiplies."""
    return frozenset(
        t.qtype for t in read_header(path).tensors if len(t.dims) > 1 and not t.name.endswith(CONV_WEIGHTS)
    )


def buffers_for(*paths: str) -> bool:
    """Whether one llama.cpp program loading these model files may put weights in its extra
    buffer types: it has one setting for all of them, so only where localspec loads each of
    them so (extra_buffers); a file it cannot read counts as any model."""
    try:
        return all(extra_buffers(matrix_types(path)) for path in paths) if paths else extra_buffers()
    except ModelLoadError:
        return extra_buffers()


def kernels_for(path: str, exact: bool, offloaded: bool, threads: int | None, stateful: bool = False) -> KernelPlan:
    """kernel_plan for the model file at path, on this llama.cpp and with this process's settings."""
    types = matrix_types(path)
    return kernel_plan(
        types,
        KernelSettings(
            exact=exact,
            llamafile=not batch_invariant_build(),
            flash=not exact and flash_attention() != FLASH_ATTN["off"],
            threads=threads or physical_cores(),
            repack=extra_buffers(types),
            repack_forced=os.environ.get("LLAMA_ARG_REPACK", "").lower() not in ("", "0", "false", "off"),
            stateful=stateful,
            offloaded=offloaded,
        ),
    )
