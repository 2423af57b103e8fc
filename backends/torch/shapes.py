"""The exact shapes of a few models people run on one consumer GPU, as ModelConfigs, and a
model of those shapes with random weights built on a device: speed does not depend on the
weights' values, so memory and timing questions about an 8B target need no download."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .config import ModelConfig
from .layers import Model
from .linear import Dense, low_bit
from .quantized import Q6_K, Matrix, head_kind, quantize_groups, quantize_rows


@dataclass(frozen=True)
class Dims:
    """A model's sizes, as its config.json gives them."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int


def llama3(d: Dims) -> ModelConfig:
    return ModelConfig(
        "llama", "llama", d.vocab, d.hidden, d.layers, d.heads, d.kv_heads, d.head_dim, d.ffn, 1e-5, 500_000.0, 131_072
    )


def qwen2(d: Dims) -> ModelConfig:
    return ModelConfig(
        "llama", "qwen2", d.vocab, d.hidden, d.layers, d.heads, d.kv_heads, d.head_dim, d.ffn, 1e-6, 1e6, 32_768
    )


# name -> (config, tied embeddings, Q/K/V biases): from each model's config.json
SHAPES: dict[str, tuple[ModelConfig, bool, bool]] = {
    "llama-3.1-8b": (llama3(Dims(128_256, 4096, 32, 32, 8, 128, 14_336)), False, False),
    "llama-3.2-1b": (llama3(Dims(128_256, 2048, 16, 32, 8, 64, 8192)), True, False),
    "qwen2.5-7b": (qwen2(Dims(152_064, 3584, 28, 28, 4, 128, 18_944)), False, True),
    "qwen2.5-0.5b": (qwen2(Dims(151_936, 896, 24, 14, 2, 64, 4864)), True, True),
    # Small enough for a CPU smoke test of everything that uses the shapes above.
    "tiny": (llama3(Dims(512, 128, 2, 4, 2, 32, 256)), True, False),
}


def shape(name: str) -> tuple[ModelConfig, bool, bool]:
    return SHAPES[name]


def random_model(
    name: str, kind: str, n_ctx: int, device: torch.device, dtype: torch.dtype, layers: int | None = None
) -> Model:
    """The torch backend's own Llama-style model at a named shape, random weights made on the
    device one matrix at a time, its matrices dense (in dtype) or in `kind` ("int4", "int8";
    an int4 model's head in int8, as a converted Q4_K_M file's).
    `layers` cuts the depth (a smaller run with per-layer figures that scale)."""
    from .llama import Model as LlamaModel

    config, tied, bias = SHAPES[name]
    if layers is not None:
        config = replace(config, n_layers=layers)
    generator = torch.Generator(device=device).manual_seed(0)
    c = config
    scale = c.hidden**-0.5

    def matrix(out: int, width: int, layout: str = kind) -> Matrix:
        weight = torch.randn(out, width, device=device, dtype=dtype, generator=generator) * scale
        if layout == "int4":
            return quantize_groups(weight)
        return quantize_rows(weight) if layout == "int8" else weight

    head = head_kind(kind, Q6_K)  # as a Q4_K_M file's Q6_K head converts

    def vector(size: int, value: float | None = None) -> torch.Tensor:
        if value is not None:
            return torch.full((size,), value, device=device, dtype=dtype)
        return torch.randn(size, device=device, dtype=dtype, generator=generator) * 0.02

    table: dict[str, Matrix] = {"output_norm.weight": vector(c.hidden, 1.0)}
    embed = torch.randn(c.vocab_size, c.hidden, device=device, dtype=dtype, generator=generator) * 0.02
    table["token_embd.weight"] = embed if not tied else matrix(c.vocab_size, c.hidden, head)
    if not tied:
        table["output.weight"] = matrix(c.vocab_size, c.hidden, head)
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    for i in range(c.n_layers):
        p = f"blk.{i}."
        table[p + "attn_norm.weight"] = vector(c.hidden, 1.0)
        table[p + "ffn_norm.weight"] = vector(c.hidden, 1.0)
        for part, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            table[p + part + ".weight"] = matrix(rows, c.hidden)
            if bias:
                table[p + part + ".bias"] = vector(rows)
        table[p + "attn_output.weight"] = matrix(c.hidden, q)
        table[p + "ffn_gate.weight"] = matrix(c.ffn, c.hidden)
        table[p + "ffn_up.weight"] = matrix(c.ffn, c.hidden)
        table[p + "ffn_down.weight"] = matrix(c.hidden, c.ffn)
    factory = Dense if kind == "dense" else low_bit(device)
    model: Model = LlamaModel(config, table, n_ctx, factory)
    return model
