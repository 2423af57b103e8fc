"""Pieces every decoder family shares: the static KV cache, RoPE, the attention over a block
of new tokens, and what one forward pass needs to know about where its tokens sit.

The cache is allocated once for the whole context: appending writes rows at the block's
positions, rolling back is just a smaller position next time (rows past it are overwritten
before anyone reads them). A block of n tokens at positions past..past+n-1 attends to the
cached keys 0..past+n-1 through a causal mask over its own n rows, so verifying k drafted
tokens is one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from . import native
from .config import ModelConfig
from .linear import Factory, Linear
from .quantized import Matrix, concatenated

# The native attention kernel takes blocks up to this long (decode and verify steps); a
# prefill's many queries go through batched matmuls, which use every thread.
NATIVE_ATTENTION = 16


class Model(Protocol):
    """What an architecture module's Model offers (llama.Model, gemma3.Model)."""

    config: ModelConfig
    window: int  # the sliding window of local layers, 0 when the model has none
    output: Linear  # the output head, vocab x hidden

    def forward(
        self, tokens: torch.Tensor, block: Block, cache: KVCache, logits: str, n_layers: int | None = None
    ) -> torch.Tensor:
        """head(layers_from(embedding(tokens), block, cache, 0, n_layers), logits)"""
        ...

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def layers_from(
        self, x: torch.Tensor, block: Block, cache: KVCache, start: int, end: int | None = None
    ) -> torch.Tensor:
        """Hidden states x entering block `start`, carried through blocks start..end-1: the
        seam where an early-exit drafter stops and where the target resumes from its work."""
        ...

    def head(self, x: torch.Tensor, logits: str) -> torch.Tensor: ...

    def requantized(self, linear: Factory) -> Model:
        """A copy with every matrix remade by `linear` (a QSpec-style self-drafter)."""
        ...


class KVCache:
    """Keys and values of every layer, [layers, kv_heads, n_ctx, head_dim], preallocated."""

    def __init__(
        self, n_layers: int, n_kv_heads: int, n_ctx: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (n_layers, n_kv_heads, n_ctx, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n_ctx = n_ctx


@dataclass
class Span:
    """The cached positions a block's queries read, [start, end), and the additive mask
    (0 or -inf per query and key) of which ones each query may see; None: all of them.
    On the eager path, where the block's queries sit at positions end-n..end-1, `causal`
    says so and `window` is the sliding window the mask encodes (0: none): enough for the
    native kernel to derive the mask itself."""

    start: int
    end: int
    mask: torch.Tensor | None
    causal: bool = False
    window: int = 0


@dataclass
class Block:
    """Where one forward pass's tokens go. `past` is set on the eager path (the block is
    contiguous and its cache rows are a slice); the CUDA-graph path leaves it None and works
    from the `positions` tensor alone, so one captured graph serves every position."""

    positions: torch.Tensor  # [n] int64
    past: int | None
    full: Span  # for global-attention layers
    local: Span  # for sliding-window layers (the same as `full` when the model has none)


def eager_block(positions: torch.Tensor, past: int, n: int, window: int, dtype: torch.dtype) -> Block:
    full = _eager_span(positions, past, n, 0, dtype)
    return Block(positions, past, full, _eager_span(positions, past, n, window, dtype) if window else full)


def _eager_span(positions: torch.Tensor, past: int, n: int, window: int, dtype: torch.dtype) -> Span:
    end = past + n
    start = max(0, past - window + 1) if window else 0
    if n == 1:
        return Span(start, end, None, True, window)  # one query sees every key in its span
    keys = torch.arange(start, end, device=positions.device)
    query = positions[:, None]
    visible = keys[None, :] <= query  # causal over the block's own rows
    if window:
        visible &= keys[None, :] > query - window
    return Span(start, end, additive(visible, dtype), True, window)


def static_block(positions: torch.Tensor, n_ctx: int, window: int, dtype: torch.dtype) -> Block:
    """Attention over the whole cache, masked from the positions tensor: no Python int
    depends on where the block sits, which is what lets a CUDA graph replay it anywhere."""
    keys = torch.arange(n_ctx, device=positions.device)
    query = positions[:, None]
    causal = keys[None, :] <= query
    full = Span(0, n_ctx, additive(causal, dtype))
    local = Span(0, n_ctx, additive(causal & (keys[None, :] > query - window), dtype)) if window else full
    return Block(positions, None, full, local)


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the 0 / -inf tensor added to attention scores."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


def write_cache(cache: KVCache, layer: int, block: Block, k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v: [kv_heads, n, head_dim] for the block's positions."""
    if block.past is not None:
        end = block.past + k.shape[1]
        cache.k[layer, :, block.past : end] = k
        cache.v[layer, :, block.past : end] = v
    else:
        cache.k[layer].index_copy_(1, block.positions, k)
        cache.v[layer].index_copy_(1, block.positions, v)


def attend(q: torch.Tensor, cache: KVCache, layer: int, span: Span, scale: float, n_kv_heads: int) -> torch.Tensor:
    """q: [heads, n, head_dim] -> [n, heads * head_dim]. Grouped-query attention without
    copying the keys: the query heads that share a KV head are folded into its rows."""
    heads, n, dim = q.shape
    kernels = native_for(q)
    if kernels is not None and span.causal and n <= NATIVE_ATTENTION and dim % 8 == 0 and q.stride()[::2] == (dim, 1):
        k, v = cache.k[layer], cache.v[layer]
        return kernels.attention(q.transpose(0, 1), k, v, span.end - n, span.window, scale)
    group = heads // n_kv_heads
    k = cache.k[layer, :, span.start : span.end]
    v = cache.v[layer, :, span.start : span.end]
    if q.is_cuda:
        out = fused_attention(q.view(n_kv_heads, group, n, dim), k, v, span.mask, scale)
        return out.reshape(heads, n, dim).transpose(0, 1).reshape(n, heads * dim)
    q = q.reshape(n_kv_heads, group * n, dim)  # rows ordered (head in group, position)
    mask = span.mask.repeat(group, 1) if span.mask is not None and group > 1 else span.mask
    # On the CPU, SDPA is slow on a strided view of the cache; three batched matmuls are not.
    kt = k.transpose(1, 2)
    scores = torch.bmm(q, kt).mul_(scale) if mask is None else torch.baddbmm(mask, q, kt, alpha=scale)
    out = torch.bmm(torch.softmax(scores, -1), v)
    return out.view(heads, n, dim).transpose(0, 1).reshape(n, heads * dim)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """q: [kv_heads, group, n, dim]; k, v: [kv_heads, keys, dim] -> [kv_heads, group, n, dim].

    SDPA's fused kernels take 4-D tensors only: given 3-D ones it runs its math path, which
    copies the whole key span to float32 in every layer (over the graphs' span of n_ctx keys
    that was 60 % of a SmolLM2-135M decode step on an H100). Here the KV heads are the batch
    and the query heads sharing one are its heads, the keys broadcast across them (stride 0):
    grouped-query attention with no copy of the keys, the queries or the mask (torch 2.11 on
    an H100 then runs cuDNN's fused kernel)."""
    kv_heads, group, n, dim = q.shape
    keys = k.shape[1]
    k4 = k[:, None].expand(kv_heads, group, keys, dim)
    v4 = v[:, None].expand(kv_heads, group, keys, dim)
    bias = None if mask is None else mask[None, None].expand(kv_heads, group, n, keys)
    return F.scaled_dot_product_attention(q, k4, v4, attn_mask=bias, scale=scale)


def rope_attend(
    qkv: torch.Tensor, cache: KVCache, layer: int, block: Block, span: Span, rope: Rope, scale: float
) -> torch.Tensor | None:
    """RoPE on Q and K, the cache write and the attention of a short eager block in one
    native call (one instead of ~20 operator dispatches per layer); None where the kernel
    does not apply, and the caller goes the operator way."""
    kernels = native_for(qkv)
    n, _, dim = qkv.shape
    if kernels is None or not span.causal or n > NATIVE_ATTENTION or dim % 8 or dim > 512:
        return None
    if block.past is None or not qkv.is_contiguous() or rope.cos.dtype != torch.float32:
        return None
    k, v = cache.k[layer], cache.v[layer]
    return kernels.rope_attention(qkv, rope.cos, rope.sin, k, v, block.past, span.window, scale)


Rotation = tuple[torch.Tensor, torch.Tensor, int]  # cos and sin rows of a block's positions, half


class Rope:
    """Rotate-half RoPE (Hugging Face's layout) with cos/sin tables for every position."""

    def __init__(
        self,
        head_dim: int,
        n_ctx: int,
        theta: float,
        scale: float,
        dtype: torch.dtype,
        device: torch.device,
        factors: torch.Tensor | None = None,
    ) -> None:
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if factors is not None:  # Llama 3.1's per-frequency divisors
            inv_freq = inv_freq / factors.to(torch.float64).cpu()
        angles = torch.outer(torch.arange(n_ctx, dtype=torch.float64) / scale, inv_freq)
        # rotate_half(x) = [-x2, x1] = roll(x, d/2) with the sign folded into sin's first half.
        self.cos = torch.cat([angles.cos(), angles.cos()], -1).to(dtype=dtype, device=device)
        self.sin = torch.cat([-angles.sin(), angles.sin()], -1).to(dtype=dtype, device=device)
        self.half = head_dim // 2

    def at(self, positions: torch.Tensor) -> Rotation:
        """The rotation for a block's positions, looked up once per forward pass."""
        return self.cos[positions][:, None], self.sin[positions][:, None], self.half


def native_for(x: torch.Tensor) -> native.Kernels | None:
    """The native kernels when x is a float32 CPU tensor and they could be built."""
    return native.kernels() if x.dtype == torch.float32 and x.is_cpu else None


def rotate(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x: [n, heads, head_dim] rotated by RoPE: x·cos + rotate_half(x)·sin."""
    cos, sin, half = rotation
    return x * cos + torch.roll(x, half, -1) * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    kernels = native_for(x)
    if kernels is not None and x.dim() == 2 and x.shape[1] % 8 == 0 and x.is_contiguous():
        return kernels.rms_norm(x, weight, eps)
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    # Half precision: normalise in float32 as the reference implementations do.
    return F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight


def fused(parts: Sequence[Matrix | None]) -> Matrix | None:
    """One matrix for projections that read the same input (q, k, v; gate, up): one matmul."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if len(present) != len(parts):
        raise ValueError("some of the fused projections are missing")
    return concatenated(present)
