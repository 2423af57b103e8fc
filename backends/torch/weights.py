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
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from localspec.errors import ModelLoadError

from . import converted, quantized
from .config import ModelConfig, from_gguf, from_hf, llama3_rope_factors

# Architectures whose GGUF stores Q/K rows permuted for llama.cpp's interleaved RoPE.
PERMUTED_QK = {"llama"}

HF_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
HF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",
}
# Gemma 3 has four norms per layer; the one after attention is not the FFN's input norm.
GEMMA3_LAYER_NAMES = {
    **HF_LAYER_NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")

Array = npt.NDArray[Any]
TensorSink = Callable[[str, quantized.Matrix], None]


# -- GGUF -------------------------------------------------------------------------------------

# GGUF value types (gguf.GGUFValueType): fixed-size scalars as struct codes
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_NUMPY: dict[int, npt.DTypeLike] = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32}
_NUMPY.update({6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64})


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # fastest-varying first, as GGUF lists them
    qtype: int
    offset: int  # from the start of the file


@dataclass
class GGUFFile:
    """A GGUF's metadata and tensor table. Read here rather than with gguf.GGUFReader, which
    builds a numpy view per vocabulary string and takes seconds on a 50k-token vocabulary;
    the tensors themselves are still dequantized by the gguf package."""

    path: str
    meta: dict[str, Any]
    tensors: list[GGUFTensor]

    def tensor(self, t: GGUFTensor) -> Array:
        """One tensor as float32, in PyTorch's [out, in] order."""
        import gguf

        raw = self.raw(t)
        data = np.array(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.qtype)), dtype=np.float32)
        return data.reshape(tuple(reversed(t.dims)))  # a writable copy, off the file

    def raw(self, t: GGUFTensor) -> Array:
        """One tensor's bytes as stored, one row (its blocks) per output row."""
        import gguf

        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.qtype)]
        rows = int(np.prod(t.dims[1:])) if len(t.dims) > 1 else 1
        shape = (rows, t.dims[0] // block * size)
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.offset, shape=shape).view(np.ndarray)


class _Cursor:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, code: str) -> Any:
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item in _NUMPY:
                dtype = np.dtype(_NUMPY[item]).newbyteorder("<")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += arr.nbytes
                return arr.tolist()
            return [self.value(item) for _ in range(count)]
        return self.scalar(_SCALARS[kind])


def open_gguf(path: str) -> GGUFFile:
    try:
        with open(path, "rb") as fh:
            return _parse_gguf(path, fh)
    except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"cannot read {path} as GGUF ({type(exc).__name__}: {exc})", "download the file again"
        ) from exc


def _parse_gguf(path: str, fh: Any) -> GGUFFile:
    size = 1 << 20
    while True:  # the header is read in one piece, growing until it holds every field
        fh.seek(0)
        cur = _Cursor(fh.read(size))
        try:
            return _parse_header(path, cur)
        except struct.error:
            if len(cur.buf) < size:
                raise
            size *= 4


def _parse_header(path: str, cur: _Cursor) -> GGUFFile:
    if cur.buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    cur.pos = 4
    version = cur.scalar("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.scalar("Q") for _ in range(cur.scalar("I")))
        infos.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
    align = int(meta.get("general.alignment", 32))
    start = (cur.pos + align - 1) // align * align
    tensors = [GGUFTensor(name, dims, qtype, start + offset) for name, dims, qtype, offset in infos]
    return GGUFFile(path, meta, tensors)


def gguf_config(meta: dict[str, Any]) -> ModelConfig:
    arch = meta.get("general.architecture", "?")
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or int(meta.get(f"{arch}.vocab_size", 0))
    return from_gguf(meta, vocab)


def read_gguf_tensors(file: GGUFFile, config: ModelConfig, sink: TensorSink, kind: str | None = None) -> None:
    """Every tensor as float; with `kind` ("int4", "int8"), every matrix as the codes of
    torch's low-bit kernels instead (quantized.py), converted once per file and cached."""
    if kind is None:
        for tensor in file.tensors:
            sink(tensor.name, torch.from_numpy(_permuted(tensor.name, file.tensor(tensor), config)))
        return
    entry = converted.entry(file.path, kind)
    stored = converted.load(entry)
    made: dict[str, quantized.Codes] = {}
    tied = all(t.name != "output.weight" for t in file.tensors)  # then the embedding is the head
    for tensor in file.tensors:
        if len(tensor.dims) != 2 or (tensor.name == "token_embd.weight" and not tied):
            sink(tensor.name, torch.from_numpy(file.tensor(tensor)))
            continue
        codes = stored.get(tensor.name) if stored is not None else None
        if codes is None:
            # Q/K rows back in rotate-half order: rows of blocks are independent, so the raw
            # rows are reordered before converting.
            raw = _permuted(tensor.name, file.raw(tensor), config)
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
    if name in HF_GLOBAL_NAMES:
        return HF_GLOBAL_NAMES[name]
    match = _HF_LAYER.match(name)
    if match is None:
        return None
    layer, module, kind = match.groups()
    table = GEMMA3_LAYER_NAMES if config.family == "gemma3" else HF_LAYER_NAMES
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
