"""Weights from a GGUF file or a Hugging Face safetensors folder, under one naming scheme.

Tensors are named as GGUF names them (`token_embd.weight`, `blk.3.attn_q.weight`, ...), in
PyTorch's [out, in] layout, with the Hugging Face conventions for the values: Q and K rows in
the rotate-half RoPE order and Gemma's RMSNorm weights with the +1 folded in (as llama.cpp's
converter stores them). GGUF tensors of any quantization are dequantized with the `gguf`
package, one at a time, and handed on at once so peak memory stays near one copy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from localspec.common.gguf_header import GGUFHeader, GGUFTensor
from localspec.core.errors import ModelLoadError

from ..tensor_names import GEMMA3_LAYER_NAMES, GLOBAL_NAMES, LAYER_NAMES, inverted
from . import converted, quantized
from .config import ModelConfig, from_gguf, from_hf, llama3_rope_factors

# Architectures whose GGUF stores Q/K rows permuted for llama.cpp's interleaved RoPE.
PERMUTED_QK = {"llama"}

HF_GLOBAL_NAMES = inverted(GLOBAL_NAMES)
HF_LAYER_NAMES = inverted(LAYER_NAMES)
HF_GEMMA3_LAYER_NAMES = inverted(GEMMA3_LAYER_NAMES)
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")

Array = npt.NDArray[Any]
TensorSink = Callable[[str, quantized.Matrix], None]


# -- GGUF -------------------------------------------------------------------------------------


def tensor_data(file: GGUFHeader, t: GGUFTensor) -> Array:
    """One tensor as float32, in PyTorch's [out, in] order, dequantized by the gguf package."""
    import gguf

    data = np.array(gguf.quants.dequantize(raw_blocks(file, t), gguf.GGMLQuantizationType(t.qtype)), dtype=np.float32)
    return data.reshape(tuple(reversed(t.dims)))  # a writable copy, off the file


def raw_blocks(file: GGUFHeader, t: GGUFTensor) -> Array:
    """One tensor's bytes as stored, one row (its blocks) per output row."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.qtype)]
    rows = int(np.prod(t.dims[1:])) if len(t.dims) > 1 else 1
    shape = (rows, t.dims[0] // block * size)
    return np.memmap(file.path, dtype=np.uint8, mode="r", offset=t.offset, shape=shape).view(np.ndarray)


def gguf_config(meta: dict[str, Any]) -> ModelConfig:
    arch = meta.get("general.architecture", "?")
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or int(meta.get(f"{arch}.vocab_size", 0))
    return from_gguf(meta, vocab)


def read_gguf_tensors(file: GGUFHeader, config: ModelConfig, sink: TensorSink, kind: str | None = None) -> None:
    """Every tensor as float; with `kind` ("int4", "int8"), every matrix as the codes of
    torch's low-bit kernels instead (quantized.py), converted once per file and cached."""
    if kind is None:
        for tensor in file.tensors:
            sink(tensor.name, torch.from_numpy(_permuted(tensor.name, tensor_data(file, tensor), config)))
        return
    entry = converted.entry(file.path, kind)
    stored = converted.load(entry)
    made: dict[str, quantized.Codes] = {}
    tied = all(t.name != "output.weight" for t in file.tensors)  # then the embedding is the head
    for tensor in file.tensors:
        if len(tensor.dims) != 2 or (tensor.name == "token_embd.weight" and not tied):
            sink(tensor.name, torch.from_numpy(tensor_data(file, tensor)))
            continue
        codes = stored.get(tensor.name) if stored is not None else None
        if codes is None:
            # Q/K rows back in rotate-half order: rows of blocks are independent, so the raw
            # rows are reordered before converting.
            raw = _permuted(tensor.name, raw_blocks(file, tensor), config)
            head = tensor.name == "output.weight" or (tied and tensor.name == "token_embd.weight")
            layout = quantized.head_kind(kind, tensor.qtype) if head else kind
            made[tensor.name] = codes = quantized.convert(raw, tensor.qtype, tensor.dims[1], layout)
        sink(tensor.name, codes)
    if made:
        converted.save(entry, {**(stored or {}), **made})


def _permuted(name: str, data: Array, config: ModelConfig) -> Array:
    if config.architecture in PERMUTED_QK and name.endswith(("attn_q.weight", "attn_k.weight")):
        return unpermute_qk(data, config.n_heads if "attn_q" in name else config.n_kv_heads)
    return data


def unpermute_qk(w: Array, n_heads: int) -> Array:
    """Undo convert_hf_to_gguf's permute: llama.cpp rotates adjacent pairs (x0, x1), Hugging
    Face rotates halves (x_i, x_{i+d/2}); the converter reorders each head's rows from the
    latter to the former, and this puts them back."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -- Hugging Face safetensors -----------------------------------------------------------------


def hf_config(folder: Path) -> tuple[ModelConfig, dict[str, Any]]:
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot read {folder / 'config.json'}: {exc}", "the folder needs its config.json"
        ) from exc
    return from_hf(raw), raw


def hf_name(name: str, config: ModelConfig) -> str | None:
    """The GGUF name of a Hugging Face tensor, or None for tensors the text model does not use."""
    name = name.removeprefix("language_model.").removeprefix("model.language_model.")
    if not name.startswith(("model.", "lm_head.")):
        name = "model." + name  # Gemma3ForConditionalGeneration drops the prefix after stripping
    base = name.removesuffix(".weight")
    if base in HF_GLOBAL_NAMES:
        return f"{HF_GLOBAL_NAMES[base]}.weight"
    match = _HF_LAYER.match(name)
    if match is None:
        return None
    layer, module, kind = match.groups()
    table = HF_GEMMA3_LAYER_NAMES if config.family == "gemma3" else HF_LAYER_NAMES
    short = table.get(module)
    return None if short is None else f"blk.{layer}.{short}.{kind}"


def read_hf_tensors(folder: Path, config: ModelConfig, raw_config: dict[str, Any], sink: TensorSink) -> None:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no .safetensors files in {folder}", "download the model's weights into that folder")
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                name = hf_name(key, config)
                if name is None:
                    continue
                data = fh.get_tensor(key)
                if config.family == "gemma3" and name.endswith("norm.weight"):
                    data = data.float() + 1.0  # Gemma3RMSNorm multiplies by (1 + w)
                sink(name, data)
    factors = llama3_rope_factors(raw_config, config.head_dim, config.rope_theta)
    if factors is not None:
        sink("rope_freqs.weight", torch.tensor(factors, dtype=torch.float32))
