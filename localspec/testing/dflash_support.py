"""Tiny random-weight DFlash drafters (llama.cpp's `dflash` architecture), written beside the
tiny targets of gguf_writer.py with the `gguf` package, in the layout convert_hf_to_gguf's
DFlashModel writes: `fc` fuses the target's layer inputs at `dflash.target_layers`, each
block's K/V of those fused features are injected into the drafter's cache, and a block
[anchor, mask, mask, ...] is denoised in one non-causal pass.

A random drafter would never agree with its target, so this one is built to echo: every
mask position attends to the block's anchor (the target's last token) and reads that token
back through a tied head. The tiny targets fall into runs of one token, so the drafter is
right along a run and wrong where it ends: acceptance and rollback both happen. The fused
target features reach the output with a small weight (`focus` sets how small), so a pass
read with the wrong features gives other logits, which the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.testing.gguf_writer import add_decoder_header, write_out

HEAD_DIM = 16


@dataclass(frozen=True)
class DFlashSpec:
    target_layers: tuple[int, ...] = (1, 2)  # llama.cpp's ids: the inputs of these target blocks
    block_size: int = 16
    heads: int = 4  # heads * HEAD_DIM is the width: the target's, as z-lab's drafters have
    ffn: int = 32
    focus: float = 1.0  # the q and k norms' scale: the anchor's attention score grows with its square
    fc_scale: float = 0.5  # how strongly the target's features vary the fused input
    sharpness: float = 0.1  # the tied head's scale: larger, surer guesses (the top one is about 0.9 sure)
    target_width: int = 0  # the target's width the fc layer reads (0: the drafter's own)
    seed: int = 0


def _fields(reader: Any, prefix: str) -> dict[str, Any]:
    return {name: field for name, field in reader.fields.items() if name.startswith(prefix)}


def _copy_tokenizer(reader: Any, writer: Any) -> int:
    """The target's tokenizer, field for field (a DFlash GGUF carries its target's); returns the
    vocabulary size."""
    import gguf

    size = 0
    for name, field in _fields(reader, "tokenizer.").items():
        if name == "tokenizer.chat_template":
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(name, value, kind, sub_type=sub)
            if name == "tokenizer.ggml.tokens":
                size = len(value)
        else:
            writer.add_key_value(name, value, kind)
    return size


def _target_embeddings(reader: Any) -> np.ndarray:
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return np.asarray(tensor.data, dtype=np.float32).reshape(int(tensor.shape[1]), int(tensor.shape[0]))


def dflash_tensors(spec: DFlashSpec, embeddings: np.ndarray, mask_id: int) -> dict[str, np.ndarray]:
    """The echoing drafter's weights (numpy shapes: GGUF's ne reversed). Dimension 0 marks the
    mask token, dimension 1 every other token; each head's last dimension carries the score."""
    rng = np.random.default_rng(spec.seed)
    h = spec.heads * HEAD_DIM
    if embeddings.shape[1] != h:
        raise ValueError(f"the drafter's width {h} must be the target's {embeddings.shape[1]}")
    scale = float(np.sqrt(np.mean(embeddings[:, 2:] ** 2)))
    embd = embeddings.copy()
    embd[:, :2] = 0.0
    embd[:, 1] = scale  # every token but the mask: what the anchor's key reads
    embd[mask_id] = 0.0
    embd[mask_id, 0] = 1.0  # the mask alone: what a mask's query reads
    head = embd / scale * spec.sharpness
    head[:, :2] = 0.0  # the markers never vote for a token
    last = [k * HEAD_DIM + HEAD_DIM - 1 for k in range(spec.heads)]
    wq = np.zeros((h, h), dtype=np.float32)
    wk = np.zeros((h, h), dtype=np.float32)
    wq[last, 0] = 1.0  # a mask asks along each head's last dimension
    wk[last, 1] = 1.0  # and only a real token (the anchor) answers there
    wv = np.eye(h, dtype=np.float32)
    wv[:, 0] = 0.0  # masks carry no value
    norm = np.ones(HEAD_DIM, dtype=np.float32)
    norm[-1] = spec.focus
    width = spec.target_width or h
    fc = rng.normal(0, spec.fc_scale * width**-0.5, (h, width * len(spec.target_layers))).astype(np.float32)
    fc[1] = 0.0  # the target's features never answer a mask's query along the anchor's marker
    ones = np.ones(h, dtype=np.float32)
    return {
        "token_embd.weight": embd,
        "output.weight": head,
        "fc.weight": fc,
        "enc.output_norm.weight": ones,
        "output_norm.weight": ones,
        "blk.0.attn_norm.weight": ones,
        "blk.0.attn_q.weight": wq,
        "blk.0.attn_k.weight": wk,
        "blk.0.attn_v.weight": wv,
        "blk.0.attn_output.weight": np.eye(h, dtype=np.float32),
        "blk.0.attn_q_norm.weight": norm,
        "blk.0.attn_k_norm.weight": norm.copy(),
        "blk.0.ffn_norm.weight": ones,
        "blk.0.ffn_gate.weight": rng.normal(0, h**-0.5, (spec.ffn, h)).astype(np.float32),
        "blk.0.ffn_up.weight": rng.normal(0, h**-0.5, (spec.ffn, h)).astype(np.float32),
        "blk.0.ffn_down.weight": np.zeros((h, spec.ffn), dtype=np.float32),  # the echo alone reaches the head
    }


@dataclass(frozen=True)
class DFlashShape:
    """The hyperparameters a dflash GGUF declares."""

    layers: int
    width: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    target_layers: tuple[int, ...]
    rope_base: float = 1_000_000.0


def write_dflash_file(
    reader: Any, path: Path, shape: DFlashShape, tensors: dict[str, np.ndarray], mask_id: int
) -> Path:
    """A dflash GGUF with the target's tokenizer (`reader`: the target's GGUFReader) and these tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "dflash")
    add_dflash_header(reader, writer, shape, mask_id)
    return write_out(writer, tensors, path)


def add_dflash_header(reader: Any, writer: Any, shape: DFlashShape, mask_id: int) -> None:
    """A dflash file's keys, with its target's tokenizer (`reader`: the target's GGUFReader)."""
    arch = "dflash"
    n_ctx = int(_fields(reader, "")[f"{_arch(reader)}.context_length"].contents())
    dims = (shape.width, shape.layers, shape.ffn, shape.heads, shape.kv_heads, shape.head_dim)
    add_decoder_header(writer, n_ctx, *dims)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_uint32(f"{arch}.block_size", shape.block_size)
    writer.add_array(f"{arch}.target_layers", list(shape.target_layers))
    _copy_tokenizer(reader, writer)
    writer.add_mask_token_id(mask_id)


def write_dflash_gguf(target: Path, path: Path, spec: DFlashSpec = DFlashSpec(), mask_id: int = 0) -> Path:
    """A DFlash drafter for the tiny target GGUF at `target`: its tokenizer and embeddings copied."""
    import gguf

    reader = gguf.GGUFReader(str(target))
    h = spec.heads * HEAD_DIM
    # A high RoPE base: the score's dimension barely turns across a block.
    shape = DFlashShape(1, h, spec.ffn, spec.heads, spec.heads, HEAD_DIM, spec.block_size, spec.target_layers)
    return write_dflash_file(reader, path, shape, dflash_tensors(spec, _target_embeddings(reader), mask_id), mask_id)


def _arch(reader: Any) -> str:
    return str(reader.fields["general.architecture"].contents())
