"""Small AVX2 kernels for the CPU decode and verify steps, built with the system C compiler on
first use and loaded through ctypes; None where that is not possible (no compiler, no AVX2,
not x86-64), and the callers fall back to torch's own operators.

Why: a decode or verify step multiplies 1..16 rows by every weight matrix once, so it is bound
by memory bandwidth, but MKL's sgemv/sgemm for so few rows of an [N, K] weight streams it at
about 10 GB/s on a 2-core EPYC where 19-24 GB/s is there to take.
`panel_matmul` reads weights packed in column panels [N/16, K, 16]: one contiguous stream, 16
output columns per panel held in two AVX registers per row, up to 6 rows per pass; float32,
half (widened exactly with F16C, which every AVX2 CPU has: an F16 model's weights in half the
bytes) or int8 panels. The other two replace the operators that, at one token, cost more in
dispatch than in arithmetic: RMSNorm (a composite of six ATen calls, ~30 us) and the
attention of a few queries (~50 us).

The C source lives here, not in a .c file, so it ships with every install of the package.
It is compiled with plain `cc` (about a second, no torch headers) into the user data
directory, named by its hash, so a changed kernel is rebuilt and an unchanged one is reused.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from localspec.store import data_dir, owned_privately, private_dir

PANEL = 16  # output columns per panel: two 8-float AVX registers
MAX_ROWS = 6  # rows one pass of the kernel holds in registers (12 accumulators + 2 weights + 1)

SOURCE = r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* y[r, 0:16] = x[r, :] . panel for R <= 6 rows; the panel is [K, 16] contiguous, of type T:
   F32, F16 (IEEE half, widened exactly with F16C), or Q8 (int8 with a float scale per output
   column). Named accumulators, not arrays: gcc keeps arrays of __m256 on the stack inside
   the loop. */
enum { F32 = 0, Q8 = 1, F16 = 2 };
#define ACC(r) __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = _mm256_setzero_ps();
#define FMA(r)                                                                                    \
  if (R > r) {                                                                                    \
    __m256 xv = _mm256_broadcast_ss(x + r * K + k);                                               \
    a##r##0 = _mm256_fmadd_ps(xv, w0, a##r##0);                                                   \
    a##r##1 = _mm256_fmadd_ps(xv, w1, a##r##1);                                                   \
  }
#define STORE(r)                                                                                  \
  if (R > r) {                                                                                    \
    _mm256_storeu_ps(y + r * ldy, T == Q8 ? _mm256_mul_ps(a##r##0, s0) : a##r##0);                \
    _mm256_storeu_ps(y + r * ldy + 8, T == Q8 ? _mm256_mul_ps(a##r##1, s1) : a##r##1);            \
  }
#define FMB(r)                                                                                    \
  if (R > r) {                                                                                    \
    __m256 xv = _mm256_broadcast_ss(x + r * K + k + 1);                                           \
    b##r##0 = _mm256_fmadd_ps(xv, w0, b##r##0);                                                   \
    b##r##1 = _mm256_fmadd_ps(xv, w1, b##r##1);                                                   \
  }
#define ACB(r) __m256 b##r##0 = _mm256_setzero_ps(), b##r##1 = _mm256_setzero_ps();
#define SUM(r) if (R > r) { a##r##0 = _mm256_add_ps(a##r##0, b##r##0); a##r##1 = _mm256_add_ps(a##r##1, b##r##1); }
static inline __attribute__((always_inline)) void load(const int T, const void* w, int64_t k, __m256* w0, __m256* w1) {
  if (T == Q8) {
    __m128i q = _mm_loadu_si128((const __m128i*)((const int8_t*)w + k * 16));
    *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
  } else if (T == F16) {
    *w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)w + k * 16)));
    *w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)w + k * 16 + 8)));
  } else {
    *w0 = _mm256_loadu_ps((const float*)w + k * 16);
    *w1 = _mm256_loadu_ps((const float*)w + k * 16 + 8);
  }
}
static inline __attribute__((always_inline)) void tile(
    const int R, const int T, const float* x, int64_t K, const void* w, const float* scale, float* y, int64_t ldy) {
  ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5)
  int64_t k = 0;
  if (T == Q8 && R <= 3) {
    /* int8 is compute-bound, not memory-bound: a second set of accumulators for odd k
       halves the FMA latency chain that one row's two accumulators would wait on. Not for
       float32 or half (a target's weights): one chain in every tile sums in the same order
       whatever the block size, so a verify pass computes bit for bit what a decode step
       does, and half panels what float32 panels do. */
    ACB(0) ACB(1) ACB(2)
    for (; k + 1 < K; k += 2) {
      __m256 w0, w1;
      load(T, w, k, &w0, &w1);
      FMA(0) FMA(1) FMA(2)
      load(T, w, k + 1, &w0, &w1);
      FMB(0) FMB(1) FMB(2)
    }
    SUM(0) SUM(1) SUM(2)
  }
  for (; k < K; ++k) {
    __m256 w0, w1;
    load(T, w, k, &w0, &w1);
    FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5)
  }
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  if (T == Q8) { s0 = _mm256_loadu_ps(scale); s1 = _mm256_loadu_ps(scale + 8); }
  STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
}
typedef void (*tile_fn)(const float*, int64_t, const void*, const float*, float*, int64_t);
#define TILE(R)                                                                                    \
  static void f32_##R(const float* x, int64_t K, const void* w, const float* s, float* y, int64_t ldy) { \
    tile(R, F32, x, K, w, s, y, ldy);                                                              \
  }                                                                                                \
  static void q8_##R(const float* x, int64_t K, const void* w, const float* s, float* y, int64_t ldy) { \
    tile(R, Q8, x, K, w, s, y, ldy);                                                               \
  }                                                                                                \
  static void f16_##R(const float* x, int64_t K, const void* w, const float* s, float* y, int64_t ldy) { \
    tile(R, F16, x, K, w, s, y, ldy);                                                              \
  }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
static const tile_fn F32_TILES[7] = {0, f32_1, f32_2, f32_3, f32_4, f32_5, f32_6};
static const tile_fn Q8_TILES[7] = {0, q8_1, q8_2, q8_3, q8_4, q8_5, q8_6};
static const tile_fn F16_TILES[7] = {0, f16_1, f16_2, f16_3, f16_4, f16_5, f16_6};

/* y[M, 16 * panels] = x[M, K] @ W^T, W packed as [panels, K, 16] (element size `bytes`: 4 for
   float32, 2 for half, 1 for int8 with `scale` [16 * panels]). Rows beyond 6 take more
   passes over each panel, which then comes from L1/L2, not from memory. The panels are
   shared among torch's own OpenMP threads (the same libgomp, already loaded by torch). */
void panel_matmul(const float* x, const void* w, const float* scale, float* y, int64_t M, int64_t K,
                  int64_t panels, int64_t bytes) {
  const int64_t N = panels * 16, passes = (M + 5) / 6;
  const tile_fn* tiles = bytes == 1 ? Q8_TILES : bytes == 2 ? F16_TILES : F32_TILES;
  #pragma omp parallel for schedule(static) if (panels * K >= 65536)
  for (int64_t p = 0; p < panels; ++p) {
    const char* panel = (const char*)w + p * K * 16 * bytes;
    int64_t m = 0;
    for (int64_t left = passes; left > 0; --left) {
      int64_t rows = (M - m + left - 1) / left;
      tiles[rows](x + m * K, K, panel, scale + p * 16, y + m * N + p * 16, N);
      m += rows;
    }
  }
}

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* y = x / sqrt(mean(x^2) + eps) * w, row by row; dim % 8 == 0. */
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r, x += dim, y += dim) {
    __m256 ss = _mm256_setzero_ps();
    for (int64_t i = 0; i < dim; i += 8) { __m256 v = _mm256_loadu_ps(x + i); ss = _mm256_fmadd_ps(v, v, ss); }
    __m256 scale = _mm256_set1_ps(1.0f / sqrtf(hsum(ss) / (float)dim + eps));
    for (int64_t i = 0; i < dim; i += 8)
      _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale), _mm256_loadu_ps(w + i)));
  }
}

/* Causal grouped-query attention of n new queries at positions past..past+n-1 over one
   layer's cached keys and values [kv_heads, n_ctx, dim]; `window` > 0 limits each query to
   its last `window` positions. q: row i, head h at q + i * q_row + h * dim. out: [n, heads * dim].
   scores: scratch of n_ctx floats. dim % 8 == 0. */
void attention(const float* q, int64_t q_row, const float* k, const float* v, float* out, float* scores,
               int64_t n, int64_t heads, int64_t kv_heads, int64_t n_ctx, int64_t dim, int64_t past,
               int64_t window, float scale) {
  const int64_t group = heads / kv_heads;
  for (int64_t h = 0; h < heads; ++h) {
    const float* kh = k + (h / group) * n_ctx * dim;
    const float* vh = v + (h / group) * n_ctx * dim;
    for (int64_t i = 0; i < n; ++i) {
      const float* qi = q + i * q_row + h * dim;
      const int64_t last = past + i, first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
      float top = -INFINITY;
      for (int64_t j = first; j <= last; ++j) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t d = 0; d < dim; d += 8)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(qi + d), _mm256_loadu_ps(kh + j * dim + d), acc);
        scores[j] = hsum(acc) * scale;
        if (scores[j] > top) top = scores[j];
      }
      float total = 0.0f;
      for (int64_t j = first; j <= last; ++j) total += (scores[j] = expf(scores[j] - top));
      float* o = out + i * heads * dim + h * dim;
      for (int64_t d = 0; d < dim; d += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = first; j <= last; ++j)
          acc = _mm256_fmadd_ps(_mm256_set1_ps(scores[j]), _mm256_loadu_ps(vh + j * dim + d), acc);
        _mm256_storeu_ps(o + d, _mm256_mul_ps(acc, _mm256_set1_ps(1.0f / total)));
      }
    }
  }
}

/* One layer's attention from its fused QKV projection qkv [n, heads + 2 kv_heads, dim]:
   rotate-half RoPE on the Q and K heads in place (cos, sin: [n_ctx, dim] tables, the sign of
   rotate_half folded into sin), K and V written to the cache rows past..past+n-1, then
   attention() as above. dim <= 512. */
void rope_attention(float* qkv, const float* cos, const float* sin, float* k, float* v, float* out, float* scores,
                    int64_t n, int64_t heads, int64_t kv_heads, int64_t n_ctx, int64_t dim, int64_t past,
                    int64_t window, float scale) {
  const int64_t row = (heads + 2 * kv_heads) * dim, half = dim / 2;
  float turned[512];
  for (int64_t i = 0; i < n; ++i) {
    float* r = qkv + i * row;
    const float* c = cos + (past + i) * dim;
    const float* s = sin + (past + i) * dim;
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      float* x = r + h * dim;
      for (int64_t d = 0; d < dim; ++d) turned[d] = x[d] * c[d] + x[d < half ? d + half : d - half] * s[d];
      memcpy(x, turned, dim * sizeof(float));
    }
    for (int64_t g = 0; g < kv_heads; ++g) {
      memcpy(k + (g * n_ctx + past + i) * dim, r + (heads + g) * dim, dim * sizeof(float));
      memcpy(v + (g * n_ctx + past + i) * dim, r + (heads + kv_heads + g) * dim, dim * sizeof(float));
    }
  }
  attention(qkv, row, k, v, out, scores, n, heads, kv_heads, n_ctx, dim, past, window, scale);
}
"""


def supported() -> bool:
    machine = platform.machine().lower()
    return machine in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


class Kernels:
    """The compiled functions, wrapped for float32 CPU tensors (contiguous where it says so)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        self._matmul = library.panel_matmul
        self._matmul.argtypes = (p, p, p, p, i, i, i, i)
        self._norm = library.rms_norm
        self._norm.argtypes = (p, p, p, i, i, f)
        self._attention = library.attention
        self._attention.argtypes = (p, i, p, p, p, p, i, i, i, i, i, i, i, f)
        self._rope_attention = library.rope_attention
        self._rope_attention.argtypes = (p, p, p, p, p, p, p, i, i, i, i, i, i, i, f)
        for function in (self._matmul, self._norm, self._attention, self._rope_attention):
            function.restype = None
        self._scores = torch.empty(0)

    def matmul(self, x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] float32 contiguous, panels [P, K, 16] float32, float16 or int8 -> x @ W^T
        as [M, 16 P]. int8 panels take `scale` [16 P]: W = panels · scale, per output column."""
        m, k = x.shape
        y = torch.empty((m, panels.shape[0] * PANEL), dtype=torch.float32)
        scale_ptr = scale.data_ptr() if scale is not None else 0
        bytes = panels.element_size()
        self._matmul(x.data_ptr(), panels.data_ptr(), scale_ptr, y.data_ptr(), m, k, panels.shape[0], bytes)
        return y

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [n, dim] contiguous, dim a multiple of 8."""
        y = torch.empty_like(x)
        self._norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], eps)
        return y

    def _scratch(self, n_ctx: int) -> torch.Tensor:
        if self._scores.numel() < n_ctx:
            self._scores = torch.empty(n_ctx)
        return self._scores

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int, window: int, scale: float
    ) -> torch.Tensor:
        """q [n, heads, dim] (rows may be strided, heads and dims contiguous); k, v: one
        layer's cache [kv_heads, n_ctx, dim] -> [n, heads * dim]."""
        n, heads, dim = q.shape
        kv_heads, n_ctx, _ = k.shape
        out = torch.empty((n, heads * dim))
        self._attention(
            q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), out.data_ptr(), self._scratch(n_ctx).data_ptr(),
            n, heads, kv_heads, n_ctx, dim, past, window, scale,
        )  # fmt: skip
        return out

    def rope_attention(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        past: int,
        window: int,
        scale: float,
    ) -> torch.Tensor:
        """qkv [n, heads + 2 kv_heads, dim] contiguous (rotated in place); cos, sin [n_ctx, dim];
        k, v: one layer's cache [kv_heads, n_ctx, dim], rows past..past+n-1 written -> [n, heads * dim]."""
        n, _, dim = qkv.shape
        kv_heads, n_ctx, _ = k.shape
        heads = qkv.shape[1] - 2 * kv_heads
        out = torch.empty((n, heads * dim))
        self._rope_attention(
            qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
            self._scratch(n_ctx).data_ptr(), n, heads, kv_heads, n_ctx, dim, past, window, scale,
        )  # fmt: skip
        return out


@functools.cache
def kernels() -> Kernels | None:
    """The kernels, built on first use; None where they cannot be (LOCALSPEC_TORCH_KERNELS=0
    also says no, for comparisons)."""
    if os.environ.get("LOCALSPEC_TORCH_KERNELS", "1") == "0" or not supported():
        return None
    path = _build()
    return Kernels(ctypes.CDLL(str(path))) if path is not None else None


def describe() -> str:
    """What runs the CPU steps, for the backend's description (and so for the calibration
    cache's key: a changed kernel is measured again)."""
    return f"avx2-{_digest()}" if kernels() is not None else "torch"


def _digest() -> str:
    return hashlib.sha256(SOURCE.encode()).hexdigest()[:16]


def _build() -> Path | None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    target = data_dir() / "kernels" / f"torch-cpu-{_digest()}.so"
    private_dir(target.parent)
    if not owned_privately(target.parent):
        return None  # a folder others can write to could hand us their code
    if target.exists():
        return target if owned_privately(target) else None
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, out = Path(tmp) / "kernel.c", Path(tmp) / "kernel.so"
        source.write_text(SOURCE)
        flags = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-lm"]
        command = [compiler, *flags, str(source), "-o", str(out)]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        os.replace(out, target)  # atomic: a concurrent process sees the old state or the whole file
    return target
