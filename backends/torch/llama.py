"""Llama-style decoders: Llama 2/3, SmolLM, Mistral, Qwen2/2.5 (QKV bias) and Qwen3 (QK norm).

Per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)); x += W2·(silu(W1·n(x)) ⊙ W3·n(x)),
with n an RMSNorm. Q, K and V are one matmul, gate and up another.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, MutableMapping

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .layers import Block, KVCache, Rope, Rotation, attend, fused, rms_norm, rope_attend, rotate, write_cache
from .linear import Dense, Factory, Linear
from .quantized import Matrix, as_float

# Float tensors, or for a quantized target's matrices the codes its GGUF was converted into.
Weights = MutableMapping[str, Matrix]


def tensor(value: Matrix | None) -> torch.Tensor | None:
    """A norm, bias or table entry: always a float tensor."""
    return None if value is None else as_float(value)


class Layer:
    """One block's tensors, taken out of the weight table (so fused copies do not double
    the memory while a model loads); its matrices made into `linear` weights."""

    LINEARS = ("wqkv", "wo", "w13", "w2")

    def __init__(self, w: Weights, prefix: str, linear: Factory = Dense) -> None:
        def matrix(name: str) -> Matrix | None:
            return w.pop(prefix + name, None)

        def take(name: str) -> torch.Tensor | None:
            return tensor(matrix(name))

        def need(name: str) -> Matrix:
            value = matrix(name)
            if value is None:
                raise KeyError(prefix + name)
            return value

        self.attn_norm = as_float(need("attn_norm.weight"))
        wqkv = fused([matrix("attn_q.weight"), matrix("attn_k.weight"), matrix("attn_v.weight")])
        if wqkv is None:
            raise KeyError(prefix + "attn_q.weight")
        self.wqkv: Linear = linear(wqkv, tensor(fused([take("attn_q.bias"), take("attn_k.bias"), take("attn_v.bias")])))
        self.wo: Linear = linear(need("attn_output.weight"), None)
        self.q_norm, self.k_norm = take("attn_q_norm.weight"), take("attn_k_norm.weight")
        self.ffn_norm = as_float(need("ffn_norm.weight"))
        w13 = fused([matrix("ffn_gate.weight"), matrix("ffn_up.weight")])
        if w13 is None:
            raise KeyError(prefix + "ffn_gate.weight")
        self.w13: Linear = linear(w13, None)
        self.w2: Linear = linear(need("ffn_down.weight"), None)
        self.extra(take)

    def extra(self, take: Callable[[str], torch.Tensor | None]) -> None:
        """Family-specific tensors of the block."""

    def requantized(self, linear: Factory) -> Layer:
        clone = copy.copy(self)
        for name in self.LINEARS:
            old: Linear = getattr(self, name)
            setattr(clone, name, linear(old.dense(), old.bias))
        return clone


class Model:
    layer_type = Layer

    def __init__(self, config: ModelConfig, weights: Weights, n_ctx: int, linear: Factory = Dense) -> None:
        self.config = config
        embed = weights.pop("token_embd.weight")
        self.norm = as_float(weights["output_norm.weight"])
        self.dtype, self.device = self.norm.dtype, self.norm.device
        head = weights.pop("output.weight", None)
        self.output: Linear = linear(embed if head is None else head, None)
        # Tied embeddings (no output.weight): the embedding is the head read by rows, unless
        # the head's layout has no cheap rows (packed int4): then a dense table of its own.
        tied = head is None and self.output.cheap_rows
        self.embed: Linear = self.output if tied else Dense(as_float(embed).to(device=self.device, dtype=self.dtype))
        self.layers = [self.layer_type(weights, f"blk.{i}.", linear) for i in range(config.n_layers)]
        self.rope = Rope(
            config.head_dim,
            n_ctx,
            config.rope_theta,
            config.rope_scale,
            self.dtype,
            self.device,
            tensor(weights.get("rope_freqs.weight")),
        )
        self.window = 0

    def requantized(self, linear: Factory) -> Model:
        """A copy whose matrices (every block's and the output head) are linear(W) of this
        model's, tensors of its own; the embedding, norms and RoPE tables are shared, and
        nothing in a forward pass writes to them."""
        clone = copy.copy(self)
        clone.layers = [layer.requantized(linear) for layer in self.layers]
        clone.output = linear(self.output.dense(), None)
        return clone

    def forward(
        self, tokens: torch.Tensor, block: Block, cache: KVCache, logits: str, n_layers: int | None = None
    ) -> torch.Tensor:
        """Hidden states through the first n_layers (all by default: an early exit is the
        seam for layer-skip self-drafting), then logits for "all" rows, the "last" or "none"."""
        return self.head(self.layers_from(self.embedding(tokens), block, cache, 0, n_layers), logits)

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        # A low-bit table's rows come back in float32; the blocks and the KV cache are in dtype.
        return self.embed.rows(tokens).to(self.dtype)

    def layers_from(
        self, x: torch.Tensor, block: Block, cache: KVCache, start: int, end: int | None = None
    ) -> torch.Tensor:
        """Hidden states x entering block `start`, carried through blocks start..end-1."""
        c = self.config
        n, heads, kv_heads = x.shape[0], c.n_heads, c.n_kv_heads
        rotation = self.rope.at(block.positions)
        scale = c.softmax_scale
        for i in range(start, len(self.layers) if end is None else end):
            layer = self.layers[i]
            h = rms_norm(x, layer.attn_norm, c.norm_eps)
            qkv = layer.wqkv(h).view(n, heads + 2 * kv_heads, c.head_dim)
            fused = (
                None if layer.q_norm is not None else rope_attend(qkv, cache, i, block, block.full, self.rope, scale)
            )
            x = x + layer.wo(fused if fused is not None else self.attention(qkv, layer, cache, i, block, rotation))
            h = rms_norm(x, layer.ffn_norm, c.norm_eps)
            gate, up = layer.w13(h).chunk(2, -1)
            x = x + layer.w2(F.silu(gate) * up)
        return x

    def attention(
        self, qkv: torch.Tensor, layer: Layer, cache: KVCache, i: int, block: Block, rotation: Rotation
    ) -> torch.Tensor:
        """RoPE, cache write and attention with torch operators: [n, heads * head_dim]."""
        c = self.config
        heads, kv_heads = c.n_heads, c.n_kv_heads
        v = qkv[:, heads + kv_heads :]
        if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3
            q = rotate(rms_norm(qkv[:, :heads], layer.q_norm, c.norm_eps), rotation)
            k = rotate(rms_norm(qkv[:, heads : heads + kv_heads], layer.k_norm, c.norm_eps), rotation)
        else:  # Q and K heads rotated in one go
            qk = rotate(qkv[:, : heads + kv_heads], rotation)
            q, k = qk[:, :heads], qk[:, heads:]
        write_cache(cache, i, block, k.transpose(0, 1), v.transpose(0, 1))
        return attend(q.transpose(0, 1), cache, i, block.full, c.softmax_scale, kv_heads)

    def head(self, x: torch.Tensor, logits: str) -> torch.Tensor:
        if logits == "none":
            return x[:0, :0]
        if logits == "last":
            x = x[-1:]
        return self.output(rms_norm(x, self.norm, self.config.norm_eps))
