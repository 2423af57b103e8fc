"""The hyperparameters of one decoder, read from GGUF metadata or a Hugging Face config.json.

Every family this backend runs is described by one flat record; the architecture module
chosen by `family` reads only the fields it needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localspec.core.errors import ModelLoadError

from ..gguf_hparams import read_hparams

# GGUF architecture name -> family module; Mistral GGUFs say "llama".
GGUF_FAMILIES = {"llama": "llama", "qwen2": "llama", "qwen3": "llama", "gemma3": "gemma3"}
# Hugging Face model_type -> (family, GGUF-style architecture name)
HF_FAMILIES = {
    "llama": ("llama", "llama"),
    "mistral": ("llama", "llama"),
    "qwen2": ("llama", "qwen2"),
    "qwen3": ("llama", "qwen3"),
    "gemma3_text": ("gemma3", "gemma3"),
    "gemma3": ("gemma3", "gemma3"),
}
GEMMA3_SWA_PATTERN = 6  # five local layers, then one global


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llama" (Llama, SmolLM2, Mistral, Qwen2/2.5/3) or "gemma3"
    architecture: str  # as GGUF names it
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float
    rope_theta: float
    context_length: int
    rope_scale: float = 1.0  # linear RoPE scaling: positions are divided by it
    attn_scale: float = 0.0  # softmax scale; 0 means 1/sqrt(head_dim)
    # Gemma 3: local layers see the last `sliding_window` positions and use their own RoPE base.
    sliding_window: int = 0
    local_layers: tuple[bool, ...] = ()
    rope_theta_local: float = 10_000.0
    final_softcap: float = 0.0

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def is_local(self, layer: int) -> bool:
        return bool(self.local_layers) and self.local_layers[layer]


def from_gguf(meta: Mapping[str, Any], vocab_size: int) -> ModelConfig:
    arch = str(meta.get("general.architecture", "?"))
    family = GGUF_FAMILIES.get(arch)
    if family is None:
        raise ModelLoadError(
            f"the torch backend does not run the {arch!r} architecture",
            f"it runs {', '.join(sorted(GGUF_FAMILIES))}; use --backend llamacpp for this model",
        )

    hp = read_hparams(meta)
    common: dict[str, Any] = dict(
        family=family,
        architecture=arch,
        vocab_size=vocab_size,
        hidden=hp.hidden,
        n_layers=hp.n_layers,
        n_heads=hp.n_heads,
        n_kv_heads=hp.n_kv_heads,
        head_dim=hp.head_dim,
        ffn=hp.ffn,
        norm_eps=hp.norm_eps,
        rope_theta=hp.rope_theta,
        context_length=hp.context_length,
        rope_scale=hp.rope_factor if hp.rope_scaling == "linear" else 1.0,
        final_softcap=float(meta.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0),
    )
    if family == "gemma3":
        window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        # llama.cpp's rule: the 27B scales by hidden/heads, the others by head_dim.
        scale_dim = hp.hidden // hp.n_heads if hp.n_layers == 62 else hp.head_dim
        common.update(
            sliding_window=window,
            local_layers=_local_layers(pattern, hp.n_layers) if window else (),
            rope_theta_local=float(meta.get(f"{arch}.rope.freq_base_swa", 10_000.0)),
            attn_scale=1.0 / math.sqrt(scale_dim),
        )
    return ModelConfig(**common)


def _local_layers(pattern: Any, n_layers: int) -> tuple[bool, ...]:
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(x) for x in pattern[:n_layers])
    n = int(pattern)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


def from_hf(config: Mapping[str, Any]) -> ModelConfig:
    if "text_config" in config:  # Gemma 3 4B and up wrap the text model in a multimodal config
        config = {**config["text_config"], "model_type": config.get("model_type")}
    model_type = str(config.get("model_type", "?"))
    if model_type not in HF_FAMILIES:
        raise ModelLoadError(
            f"the torch backend does not run Hugging Face model_type {model_type!r}",
            f"it runs {', '.join(sorted(HF_FAMILIES))}",
        )
    family, arch = HF_FAMILIES[model_type]
    hidden, n_heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    n_layers = int(config["num_hidden_layers"])
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    rope = dict(rope.get("full_attention", rope))  # per-layer-type parameters in newer configs
    rope_type = str(rope.get("rope_type", rope.get("type", "default")))
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10_000.0)))
    common: dict[str, Any] = dict(
        family=family,
        architecture=arch,
        vocab_size=int(config["vocab_size"]),
        hidden=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=int(config.get("head_dim") or hidden // n_heads),
        ffn=int(config["intermediate_size"]),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        context_length=int(config.get("max_position_embeddings", 4096)),
        rope_scale=float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0,
        final_softcap=float(config.get("final_logit_softcapping") or 0.0),
    )
    if family == "gemma3":
        window = int(config.get("sliding_window") or 0)
        types = config.get("layer_types")
        local = (
            tuple(t == "sliding_attention" for t in types)
            if types
            else _local_layers(config.get("sliding_window_pattern", GEMMA3_SWA_PATTERN), n_layers)
        )
        local_rope = dict((config.get("rope_parameters") or {}).get("sliding_attention", {}))
        common.update(
            sliding_window=window,
            local_layers=local if window else (),
            rope_theta_local=float(local_rope.get("rope_theta", config.get("rope_local_base_freq", 10_000.0))),
            attn_scale=float(config.get("query_pre_attn_scalar", common["head_dim"])) ** -0.5,
        )
    return ModelConfig(**common)


def llama3_rope_factors(config: Mapping[str, Any], head_dim: int, theta: float) -> list[float] | None:
    """Llama 3.1's per-frequency RoPE divisors (what GGUF stores as rope_freqs.weight)."""
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    if str(rope.get("rope_type", rope.get("type", ""))).lower() != "llama3":
        return None
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old = float(rope.get("original_max_position_embeddings", 8192))
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out
