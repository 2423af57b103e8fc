"""Gemma 3 text decoders (1B and up; the multimodal checkpoints' language model).

What differs from Llama: embeddings scaled by sqrt(hidden); RMSNorm before and after both
attention and the FFN; RMSNorm on each Q and K head; GELU (tanh) gating; five sliding-window
layers (RoPE base 10k) for each global one (RoPE base 1M, possibly linearly scaled); an
optional tanh soft cap on the logits. Norm weights already include Gemma's +1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .layers import Block, KVCache, Rope, attend, rms_norm, rotate, write_cache
from .linear import Dense, Factory
from .llama import Layer as LlamaLayer
from .llama import Model as LlamaModel
from .llama import Weights


class Layer(LlamaLayer):
    def extra(self, take: Callable[[str], torch.Tensor | None]) -> None:
        post_attn, post_ffn = take("post_attention_norm.weight"), take("post_ffw_norm.weight")
        if post_attn is None or post_ffn is None or self.q_norm is None or self.k_norm is None:
            raise KeyError("a Gemma 3 block needs post-attention, post-FFN and Q/K norms")
        self.post_attn_norm, self.post_ffn_norm = post_attn, post_ffn
        self.qk_norms = (self.q_norm, self.k_norm)


class Model(LlamaModel):
    layer_type = Layer

    def __init__(self, config: ModelConfig, weights: Weights, n_ctx: int, linear: Factory = Dense) -> None:
        super().__init__(config, weights, n_ctx, linear)
        self.gemma_layers = [layer for layer in self.layers if isinstance(layer, Layer)]
        self.rope_local = Rope(config.head_dim, n_ctx, config.rope_theta_local, 1.0, self.dtype, self.device)
        self.window = config.sliding_window
        self.embed_scale = math.sqrt(config.hidden)

    def requantized(self, linear: Factory) -> Model:
        clone = super().requantized(linear)
        assert isinstance(clone, Model)
        clone.gemma_layers = [layer for layer in clone.layers if isinstance(layer, Layer)]
        return clone

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        return (self.embed.rows(tokens) * self.embed_scale).to(self.dtype)

    def layers_from(
        self, x: torch.Tensor, block: Block, cache: KVCache, start: int, end: int | None = None
    ) -> torch.Tensor:
        c = self.config
        eps = c.norm_eps
        n, heads, kv_heads = x.shape[0], c.n_heads, c.n_kv_heads
        rotations = (self.rope.at(block.positions), self.rope_local.at(block.positions))
        for i in range(start, len(self.gemma_layers) if end is None else end):
            layer = self.gemma_layers[i]
            local = c.is_local(i)
            rotation, span = (rotations[1], block.local) if local else (rotations[0], block.full)
            h = rms_norm(x, layer.attn_norm, eps)
            qkv = layer.wqkv(h).view(n, heads + 2 * kv_heads, c.head_dim)
            v = qkv[:, heads + kv_heads :]
            q_norm, k_norm = layer.qk_norms
            q = rotate(rms_norm(qkv[:, :heads], q_norm, eps), rotation)
            k = rotate(rms_norm(qkv[:, heads : heads + kv_heads], k_norm, eps), rotation)
            write_cache(cache, i, block, k.transpose(0, 1), v.transpose(0, 1))
            a = attend(q.transpose(0, 1), cache, i, span, c.softmax_scale, c.n_kv_heads)
            x = x + rms_norm(layer.wo(a), layer.post_attn_norm, eps)
            h = rms_norm(x, layer.ffn_norm, eps)
            gate, up = layer.w13(h).chunk(2, -1)
            x = x + rms_norm(layer.w2(F.gelu(gate, approximate="tanh") * up), layer.post_ffn_norm, eps)
        return x

    def head(self, x: torch.Tensor, logits: str) -> torch.Tensor:
        out = super().head(x, logits)
        cap = self.config.final_softcap
        return torch.tanh(out / cap) * cap if cap and out.numel() else out
