"""A decoder's hyperparameters as GGUF metadata gives them, with the defaults llama.cpp's loader
applies, for the backends that build the model themselves (torch, MLX): one reader, so a key
both need is read, defaulted and refused the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localspec.core.errors import ModelLoadError


@dataclass(frozen=True)
class DecoderHparams:
    architecture: str  # general.architecture, the prefix of every key below
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float
    rope_theta: float
    context_length: int
    rope_scaling: str  # "none", "linear", "yarn", ...
    rope_factor: float
    expert_count: int  # 0 for a dense model


def arch_key(meta: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """`<architecture>.<name>`, else the default; a key with neither is an incomplete file."""
    arch = str(meta.get("general.architecture", "?"))
    value = meta.get(f"{arch}.{name}", default)
    if value is None:
        raise ModelLoadError(f"the GGUF has no {arch}.{name} key", "the file is incomplete; download it again")
    return value


def read_hparams(meta: Mapping[str, Any]) -> DecoderHparams:
    """The hyperparameters every decoder family has (see the module doc)."""
    hidden, n_heads = int(arch_key(meta, "embedding_length")), int(arch_key(meta, "attention.head_count"))
    return DecoderHparams(
        architecture=str(meta.get("general.architecture", "?")),
        hidden=hidden,
        n_layers=int(arch_key(meta, "block_count")),
        n_heads=n_heads,
        n_kv_heads=int(arch_key(meta, "attention.head_count_kv", n_heads)),
        head_dim=int(arch_key(meta, "attention.key_length", hidden // n_heads)),
        ffn=int(arch_key(meta, "feed_forward_length")),
        norm_eps=float(arch_key(meta, "attention.layer_norm_rms_epsilon")),
        rope_theta=float(arch_key(meta, "rope.freq_base", 10_000.0)),
        context_length=int(arch_key(meta, "context_length")),
        rope_scaling=str(arch_key(meta, "rope.scaling.type", "none") or "none"),
        rope_factor=float(arch_key(meta, "rope.scaling.factor", 1.0) or 1.0),
        expert_count=int(arch_key(meta, "expert_count", 0) or 0),
    )
