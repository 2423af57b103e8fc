"""Rollback for caches mlx-lm cannot trim: recurrent state (ArraysCache: Gated DeltaNet,
Mamba) and sliding windows that have wrapped around (RotatingKVCache).

Such a cache goes back to a *mark*: its untrimmable states as they stood at an earlier
position. The attention caches are trimmed to the same position and the kept tokens after
it are replayed. A mark costs nothing to take: MLX arrays are immutable and mlx-lm's
recurrent layers assign new ones, so it holds references (a wrapped window, written in
place, is copied, and only once it is about to wrap).

Marks are taken before every block. A qwen3_5-family model (Qwen3.5/3.6) also leaves one
after every position of a short block: its Gated DeltaNet runs the recurrence token by
token there (stepwise_hidden), so a rejected draft restores the state at the last accepted
token with nothing to replay. benchmarks/mlx_hybrid_rollback.py measured that against a
snapshot and a replay; the replay cost a forward pass over the accepted tokens each time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx.nn.layers.activations import silu
from mlx.nn.layers.base import Module
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import ArraysCache, RotatingKVCache
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

# Marks kept at most: a verify block of 16 drafted tokens, one per position, plus the one
# before it (llama.cpp keeps the same 1 + 16 recurrent states, n_rs_seq). On Qwen3.6-27B a
# mark holds about 150 MB of recurrent state.
MARK_LIMIT = 18

Saved = Any  # per cache: None (trim it), an ArraysCache's arrays, or a window's state


def needs_marks(cache: Sequence[Any]) -> bool:
    """Whether trimming alone cannot take this cache back (now or once a window wraps)."""
    return any(isinstance(c, ArraysCache | RotatingKVCache) or not c.is_trimmable() for c in cache)


def capture(cache: Sequence[Any], block: int) -> list[Saved]:
    """The states trimming cannot restore, before a block of `block` tokens."""
    saved: list[Saved] = []
    for c in cache:
        if isinstance(c, ArraysCache):
            saved.append(list(c.cache))
        elif isinstance(c, RotatingKVCache) and c.keys is not None and c.offset + block >= c.max_size:
            # Written in place from here on: a copy, taken only once the window is about to wrap.
            saved.append((mx.array(c.keys), mx.array(cast(mx.array, c.values)), c.offset, c._idx))
        elif c.is_trimmable():
            saved.append(None)
        else:
            saved.append(tuple(mx.array(s) if isinstance(s, mx.array) else s for s in c.state))
    return saved


class StateMarks:
    """Marks by position for one cache (see the module doc); restore() takes the cache back."""

    def __init__(self, limit: int = MARK_LIMIT) -> None:
        self.limit = limit
        self.marks: dict[int, list[Saved]] = {}
        self.replayed = 0  # tokens replayed by restores so far (what the benchmark reads)

    def before_block(self, past: int, cache: Sequence[Any], block: int) -> None:
        if past not in self.marks:
            self.marks[past] = capture(cache, block)
        self._prune()

    def after_block(self, past: int, cache: Sequence[Any], steps: dict[int, list[list[mx.array]]]) -> None:
        """Per-position marks from a block whose recurrent layers recorded every step."""
        if not steps:
            return
        n = len(next(iter(steps.values())))
        recorded = all(i in steps or (not isinstance(c, ArraysCache) and c.is_trimmable()) for i, c in enumerate(cache))
        if not recorded or any(isinstance(c, RotatingKVCache) for c in cache):
            return
        for k in range(n):
            self.marks[past + k + 1] = [steps[i][k] if i in steps else None for i in range(len(cache))]
        self._prune()

    def _prune(self) -> None:
        for position in sorted(self.marks)[: -self.limit]:
            del self.marks[position]

    def clear(self) -> None:
        self.marks.clear()

    def restore(self, cache: Sequence[Any], n: int) -> int | None:
        """Take the cache back to the latest usable mark at or before n; its position, or None
        when there is none (the caller starts from an empty cache)."""
        usable = [p for p, saved in self.marks.items() if p <= n and _trimmable_to(cache, saved, p)]
        for position in [p for p in self.marks if p > max(usable, default=-1)]:
            del self.marks[position]  # a discarded branch's, or unusable
        if not usable:
            return None
        at = max(usable)
        for c, saved in zip(cache, self.marks[at], strict=True):
            if saved is None:
                c.trim(int(c.offset) - at)
            elif isinstance(c, ArraysCache):
                c.cache = list(saved)
            elif isinstance(c, RotatingKVCache):
                c.keys, c.values, c.offset, c._idx = saved
            else:
                c.state = saved
        self.replayed += n - at
        return at


def _trimmable_to(cache: Sequence[Any], saved: list[Saved], position: int) -> bool:
    # A window marked while it could still be trimmed may have wrapped since.
    pairs = zip(cache, saved, strict=True)
    return all(s is not None or (c.is_trimmable() and int(c.offset) >= position) for c, s in pairs)


# -- qwen3_5 family: the Gated DeltaNet run token by token over a short block ------------------


def stepwise_model(model: Module) -> bool:
    """A qwen3_5 / qwen3_5_moe model (Qwen3.5, Qwen3.6), whose layers stepwise_hidden runs."""
    from mlx_lm.models import qwen3_5

    inner = getattr(model, "model", None)
    return isinstance(inner, qwen3_5.Qwen3_5TextModel) and getattr(inner, "pipeline_size", 1) == 1


def stepwise_hidden(
    inner: Module, ids: mx.array, cache: Sequence[Any], steps: dict[int, list[list[mx.array]]] | None
) -> mx.array:
    """Qwen3_5TextModel.__call__ for one sequence, returning final-norm hidden states; with
    `steps`, each Gated DeltaNet layer i leaves steps[i][k] = its state after token k."""
    h = inner.embed_tokens(ids)
    mask = create_attention_mask(h, cache[inner.fa_idx])
    for i, (layer, c) in enumerate(zip(inner.layers, cache, strict=True)):
        x = layer.input_layernorm(h)
        if not layer.is_linear:
            h = h + layer.self_attn(x, mask, c)
        elif steps is None:
            h = h + layer.linear_attn(x, None, c)
        else:
            h = h + gated_delta_stepwise(layer.linear_attn, x, c, steps.setdefault(i, []))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    normed: mx.array = inner.norm(h)
    return normed


def gated_delta_stepwise(gdn: Module, x: mx.array, cache: ArraysCache, steps: list[list[mx.array]]) -> mx.array:
    """qwen3_5.GatedDeltaNet.__call__ (one sequence, no padding) with the recurrence run one
    token at a time, so the state after each token exists; the projections stay batched."""
    B, S, _ = x.shape
    qkv = gdn.in_proj_qkv(x)
    z = gdn.in_proj_z(x).reshape(B, S, gdn.num_v_heads, gdn.head_v_dim)
    b, a = gdn.in_proj_b(x), gdn.in_proj_a(x)
    n_keep = gdn.conv_kernel_size - 1
    conv_state = cache[0] if cache[0] is not None else mx.zeros((B, n_keep, gdn.conv_dim), dtype=x.dtype)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    conv_out = silu(gdn.conv1d(conv_input))
    q, k, v = (
        t.reshape(B, S, heads, dim)
        for t, heads, dim in zip(
            mx.split(conv_out, [gdn.key_dim, 2 * gdn.key_dim], -1),
            [gdn.num_k_heads, gdn.num_k_heads, gdn.num_v_heads],
            [gdn.head_k_dim, gdn.head_k_dim, gdn.head_v_dim],
            strict=True,
        )
    )
    q, k = normalize_qk(q, k, inv_scale=gdn.head_k_dim**-0.5, eps=1e-6)
    state = cache[1]
    ys = []
    for t in range(S):
        y, state = gated_delta_update(
            q[:, t : t + 1],
            k[:, t : t + 1],
            v[:, t : t + 1],
            a[:, t : t + 1],
            b[:, t : t + 1],
            gdn.A_log,
            gdn.dt_bias,
            state,
            None,
            use_kernel=not gdn.training,
        )
        ys.append(y)
        steps.append([mx.contiguous(conv_input[:, t + 1 : t + 1 + n_keep]), state])
    cache[0], cache[1] = steps[-1]
    out = gdn.norm(mx.concatenate(ys, axis=1), z)
    result: mx.array = gdn.out_proj(out.reshape(B, S, -1))
    return result
