"""GGUF files as mlx-lm models: mlx-lm's own architecture modules, weights from `mx.load`.

`mx.load` keeps Q4_0, Q4_1 and Q8_0 tensors quantized (as MLX affine 4/8-bit, groups of 32),
turns BF16, Q2_K, Q4_K and Q6_K into float16 and cannot read the other types; the tensor
table is read first so a file MLX would expand or refuse is named before it is loaded.

llama.cpp's converter permutes the Q and K projections of llama-family models so that
rotary embedding rotates adjacent pairs; mlx-lm's `rope_traditional=True` rotates the same
pairs, so the weights are used as stored.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.quantized import quantize

from localspec.common.gguf_header import check_gguf, read_header
from localspec.core.errors import ModelLoadError

from ..gguf_hparams import read_hparams
from ..tensor_names import GLOBAL_NAMES, LAYER_NAMES
from .modules import eval_parameters

KEPT = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q8_0"})  # used as stored
EXPANDED = frozenset({"BF16", "Q2_K", "Q4_K", "Q6_K"})  # mx.load turns these into float16

# GGUF architecture -> (mlx-lm module, rope_traditional)
ARCHITECTURES = {"llama": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False)}


@dataclass(frozen=True)
class GgufModel:
    model: Module
    metadata: dict[str, Any]
    config: dict[str, Any]
    expanded: dict[str, int]  # ggml type -> tensors MLX turned into float16


def check_types(path: str, types: Mapping[str, str]) -> dict[str, int]:
    """Counts of tensors MLX will expand to float16, by type; refuses types it cannot read."""
    unreadable = sorted({t for t in types.values() if t not in KEPT | EXPANDED})
    if unreadable:
        raise ModelLoadError(
            f"MLX cannot read {', '.join(unreadable)} tensors from GGUF ({path}); it keeps Q4_0, Q4_1 and Q8_0 "
            "quantized and expands BF16, Q2_K, Q4_K and Q6_K to float16",
            "use --backend llamacpp for this file, pick a Q4_0/Q8_0 file, or convert the original model with "
            "`mlx_lm.convert -q`",
        )
    expanded: dict[str, int] = {}
    for t in types.values():
        if t in EXPANDED:
            expanded[t] = expanded.get(t, 0) + 1
    return expanded


def plain_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """mx.load's metadata with arrays as Python values."""
    return {k: (v.tolist() if isinstance(v, mx.array) else v) for k, v in meta.items()}


def check_architecture(meta: Mapping[str, Any], path: str) -> str:
    arch = str(meta.get("general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"the MLX backend reads {', '.join(ARCHITECTURES)} GGUF files; {path} is {arch or 'unknown'!r}",
            "use --backend llamacpp for this file, or convert the original model with `mlx_lm.convert`",
        )
    return arch


def config_from_metadata(meta: Mapping[str, Any], weights: Mapping[str, mx.array], path: str) -> dict[str, Any]:
    """The mlx-lm config.json a Hugging Face checkpoint of this GGUF would have."""
    arch = check_architecture(meta, path)
    hp = read_hparams(meta)
    if hp.expert_count:
        raise ModelLoadError(
            f"{path} is a mixture-of-experts model, which the MLX backend does not read from GGUF",
            "convert the original model with `mlx_lm.convert`, or use --backend llamacpp",
        )
    module, traditional = ARCHITECTURES[arch]
    config: dict[str, Any] = {
        "model_type": module,
        "hidden_size": hp.hidden,
        "num_hidden_layers": hp.n_layers,
        "intermediate_size": hp.ffn,
        "num_attention_heads": hp.n_heads,
        "num_key_value_heads": hp.n_kv_heads,
        "head_dim": hp.head_dim,
        "rms_norm_eps": hp.norm_eps,
        "vocab_size": int(weights["model.embed_tokens.weight"].shape[0]),
        "max_position_embeddings": hp.context_length,
        "rope_theta": hp.rope_theta,
        "rope_traditional": traditional,
        "tie_word_embeddings": "lm_head.weight" not in weights,
    }
    if hp.rope_scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": hp.rope_factor}
    elif hp.rope_scaling != "none":
        raise ModelLoadError(
            f"{path} uses {hp.rope_scaling} rope scaling, which the MLX backend does not read from GGUF",
            "convert the original model with `mlx_lm.convert`, or use --backend llamacpp",
        )
    return config


def hf_names(weights: Mapping[str, mx.array], path: str) -> dict[str, mx.array]:
    """GGUF tensor names -> the Hugging Face names mlx-lm's modules load."""
    out = {}
    for name, value in weights.items():
        base, _, suffix = name.rpartition(".")
        parts = base.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
            out[f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{suffix}"] = value
        elif base in GLOBAL_NAMES:
            out[f"{GLOBAL_NAMES[base]}.{suffix}"] = value
        elif base != "rope_freqs":
            raise ModelLoadError(f"{path} has a tensor {name!r} that the MLX backend does not know where to put")
    return out


class FrequencyRoPE(Module):
    """Rotary embedding with per-dimension frequency factors (GGUF's rope_freqs tensor,
    Llama 3.1+): the angle of pair i is pos / (base^(2i/d) * factor_i), as llama.cpp computes it."""

    def __init__(self, dims: int, base: float, traditional: bool, factors: mx.array) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.dims = dims
        self.traditional = traditional
        self._freqs = (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)) * factors.astype(mx.float32)

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(
            x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def packed_layer(weights: Mapping[str, mx.array]) -> Callable[[str, Module], bool | dict[str, Any]]:
    """quantize predicate: quantize exactly the layers whose weights come packed, with
    the group size and bits their packing implies (GGUF mixes 4- and 8-bit layers)."""

    def predicate(path: str, module: Module) -> bool | dict[str, Any]:
        scales = weights.get(f"{path}.scales")
        if scales is None or not hasattr(module, "to_quantized"):
            return False
        in_dims = int(module.weight.shape[-1])
        bits = int(weights[f"{path}.weight"].shape[-1]) * 32 // in_dims
        return {"group_size": in_dims // int(scales.shape[-1]), "bits": bits}

    return predicate


def build(config: Mapping[str, Any], weights: dict[str, mx.array], path: str) -> Module:
    """An mlx-lm model of config's type holding weights (quantized layers stay quantized)."""
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model: Module = arch.Model(arch.ModelArgs.from_dict(dict(config)))
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights
    quantize(model, group_size=32, bits=4, class_predicate=packed_layer(weights))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"the weights of {path} do not fit mlx-lm's {config['model_type']} model: {exc}") from exc
    eval_parameters(model)
    model.eval()
    return model


def load_gguf(path: str) -> GgufModel:
    check_gguf(path)
    header = read_header(path)
    check_architecture(header.meta, path)  # before any tensor: a hybrid's would be misnamed
    expanded = check_types(path, {t.name: t.type_name for t in header.tensors})
    if expanded:
        what = ", ".join(f"{n} {t}" for t, n in sorted(expanded.items()))
        warnings.warn(
            f"MLX keeps only Q4_0, Q4_1 and Q8_0 GGUF weights quantized: {what} tensors of {path} "
            "were dequantized to float16 and take more memory (a Q4_0 or Q8_0 file avoids this)",
            stacklevel=3,
        )
    try:
        loaded, raw_meta = cast(tuple[dict[str, mx.array], dict[str, Any]], mx.load(path, return_metadata=True))
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"MLX could not read {path}: {exc}", "use --backend llamacpp for this file") from exc
    meta = plain_metadata(raw_meta)
    weights = hf_names(loaded, path)
    config = config_from_metadata(meta, weights, path)
    model = build(config, weights, path)
    if "rope_freqs.weight" in loaded:
        factors = loaded["rope_freqs.weight"]
        for layer in model.layers:
            attn = layer.self_attn
            attn.rope = FrequencyRoPE(int(attn.head_dim), config["rope_theta"], config["rope_traditional"], factors)
    return GgufModel(model, meta, config, expanded)
