"""Tiny vision pairs written by the tests themselves, random weights, and tiny PNG images to
show them: a llama-family target (gguf_writer.py) with a LLaVA-style projector GGUF (llama.cpp's
mtmd "mlp" type: a small CLIP tower, then a two-layer MLP out to the target's width); and a
Qwen2-VL-style pair, a "qwen2vl" target (M-RoPE: positions in time, height and width) with a
"qwen2vl_merger" projector, whose images take fewer positions than rows (max(nx, ny) of nx*ny)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from localspec.testing.gguf_writer import (
    Spec,
    add_bpe_vocab,
    add_decoder_header,
    gguf_name,
    hf_weights,
    write_gguf,
    write_out,
)


@dataclass(frozen=True)
class ProjectorSpec:
    """clip.cpp's llava graph runs the first `blocks - 1` blocks (the second-to-last layer's
    output is the feature): two blocks, one evaluated. image_size / patch_size squared is the
    number of positions an image takes in the target's context."""

    out_width: int = 64  # the target's n_embd: mtmd refuses a projector of another width
    width: int = 32
    heads: int = 2
    ffn: int = 48  # unlike width: clip.cpp swaps up/down weights whose shapes look like an old export's
    blocks: int = 2
    image_size: int = 32
    patch_size: int = 8
    seed: int = 7
    scale: float = 4.0  # the projector output's standard deviation: how loudly the image speaks

    @property
    def positions(self) -> int:
        return (self.image_size // self.patch_size) ** 2


Weights = Callable[..., np.ndarray]


def normal_weights(seed: int) -> Weights:
    """w(*shape, std=, center=): float32 draws from one generator, so a tensor's values follow
    from the seed and the order tensors are drawn in."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float, center: float = 0.0) -> np.ndarray:
        return (center + rng.normal(0, std, shape)).astype(np.float32)

    return w


def tower_blocks(w: Weights, d: int, ffn: int, blocks: int, fused_qkv: bool = False) -> dict[str, np.ndarray]:
    """A vision tower's transformer blocks under clip.cpp's names; fused_qkv: Q, K and V in one
    attn_qkv matrix, as clip.cpp's qwen3vl graph reads them."""
    out: dict[str, np.ndarray] = {}
    for i in range(blocks):
        b = f"v.blk.{i}."
        if fused_qkv:
            out |= {b + "attn_qkv.weight": w(3 * d, d, std=d**-0.5), b + "attn_qkv.bias": w(3 * d, std=0.1)}
        for part in ("attn_out",) if fused_qkv else ("attn_q", "attn_k", "attn_v", "attn_out"):
            out |= {b + part + ".weight": w(d, d, std=d**-0.5), b + part + ".bias": w(d, std=0.1)}
        out |= {
            b + "ln1.weight": w(d, std=0.1, center=1.0),
            b + "ln1.bias": w(d, std=0.1),
            b + "ln2.weight": w(d, std=0.1, center=1.0),
            b + "ln2.bias": w(d, std=0.1),
            b + "ffn_up.weight": w(ffn, d, std=d**-0.5),
            b + "ffn_up.bias": w(ffn, std=0.1),
            b + "ffn_down.weight": w(d, ffn, std=ffn**-0.5),
            b + "ffn_down.bias": w(d, std=0.1),
        }
    return out


def clip_writer(path: Path, kind: str, spec: ProjectorSpec | GridSpec | PooledSpec, image_size: int) -> Any:
    """A projector GGUF's writer with the tower's keys every projector type reads."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", kind)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.embedding_length", spec.width)
    writer.add_uint32("clip.vision.feed_forward_length", spec.ffn)
    writer.add_uint32("clip.vision.block_count", spec.blocks)
    writer.add_uint32("clip.vision.projection_dim", spec.out_width)
    writer.add_uint32("clip.vision.attention.head_count", spec.heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", spec.patch_size)
    return writer


def projector_tensors(spec: ProjectorSpec) -> dict[str, np.ndarray]:
    """Random weights under clip.cpp's names, numpy shapes (GGUF ne reversed)."""
    w = normal_weights(spec.seed)

    d, p = spec.width, spec.patch_size
    out = {
        "v.patch_embd.weight": w(d, 3, p, p, std=(3 * p * p) ** -0.5).astype(np.float16),
        "v.patch_embd.bias": w(d, std=0.1),
        "v.position_embd.weight": w(spec.positions, d, std=0.5),
        "mm.0.weight": w(spec.out_width, d, std=d**-0.5),
        "mm.0.bias": w(spec.out_width, std=0.1),
        "mm.2.weight": w(spec.out_width, spec.out_width, std=spec.scale * spec.out_width**-0.5),
        "mm.2.bias": w(spec.out_width, std=0.1 * spec.scale),
    }
    return out | tower_blocks(w, d, spec.ffn, spec.blocks)


def write_projector(spec: ProjectorSpec, path: Path) -> Path:
    writer = clip_writer(path, "mlp", spec, spec.image_size)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return write_out(writer, projector_tensors(spec), path)


def write_vision_pair(
    folder: Path, target: Spec | None = None, projector: ProjectorSpec | None = None
) -> tuple[Path, Path]:
    """(target GGUF, projector GGUF) of a tiny vision pair, widths matched."""
    target = target or Spec(arch="llama")
    projector = projector or ProjectorSpec(out_width=target.hidden)
    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(target, folder / "vision-target.gguf"), write_projector(projector, folder / "mmproj.gguf")


# -- the Qwen2-VL style: images on M-RoPE's grid ---------------------------------------------------

# The target's rotary pairs per M-RoPE section (time, height, width, unused): head_dim / 2 in
# all, as Qwen2-VL's [16, 24, 24, 0] are of its 128.
GRID_ROPE_SECTIONS = [4, 2, 2, 0]


@dataclass(frozen=True)
class GridSpec:
    """mtmd's "qwen2vl_merger": patches of patch_size pixels, rotary positions on the image's
    grid inside the tower, then each 2x2 patches merged into one row of the target's width.
    An image is resized to a multiple of 2 * patch_size a side, at least 8 rows."""

    out_width: int = 64
    width: int = 32
    heads: int = 2
    ffn: int = 48
    blocks: int = 1
    patch_size: int = 8
    seed: int = 11
    scale: float = 4.0


def grid_projector_tensors(spec: GridSpec) -> dict[str, np.ndarray]:
    w = normal_weights(spec.seed)

    d, p, merged = spec.width, spec.patch_size, 4 * spec.width
    conv_std = (2 * 3 * p * p) ** -0.5  # two kernels (Qwen's two video frames) add on a still image
    out = {
        "v.patch_embd.weight": w(d, 3, p, p, std=conv_std).astype(np.float16),
        "v.patch_embd.weight.1": w(d, 3, p, p, std=conv_std).astype(np.float16),
        "mm.0.weight": w(merged, merged, std=merged**-0.5),
        "mm.0.bias": w(merged, std=0.1),
        "mm.2.weight": w(spec.out_width, merged, std=spec.scale * merged**-0.5),
        "mm.2.bias": w(spec.out_width, std=0.1 * spec.scale),
    }
    return out | tower_blocks(w, d, spec.ffn, spec.blocks)


def write_grid_projector(spec: GridSpec, path: Path) -> Path:
    writer = clip_writer(path, "qwen2vl_merger", spec, 4 * spec.patch_size)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return write_out(writer, grid_projector_tensors(spec), path)


def write_grid_target(spec: Spec, path: Path) -> Path:
    """A Qwen2 decoder (biased Q/K/V, NeoX rotation) as llama.cpp's "qwen2vl": M-RoPE, each
    text position the same in every section, an image's rows on its grid."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2vl")
    add_decoder_header(writer, spec.n_ctx, spec.hidden, spec.layers, spec.ffn, spec.heads, spec.kv_heads, spec.head_dim)
    writer.add_chat_template(spec.chat_template)
    writer.add_rope_freq_base(10_000.0)
    writer.add_array("qwen2vl.rope.dimension_sections", GRID_ROPE_SECTIONS)
    vocab = add_bpe_vocab(writer, pre="qwen2")
    qwen2 = replace(spec, arch="qwen2")
    tensors = {gguf_name(name, qwen2): w for name, w in hf_weights(qwen2, vocab).items()}
    return write_out(writer, tensors, path)


def write_grid_pair(folder: Path, target: Spec | None = None, projector: GridSpec | None = None) -> tuple[Path, Path]:
    """(target GGUF, projector GGUF) of a tiny Qwen2-VL-style pair, widths matched."""
    target = target or Spec(arch="qwen2")
    projector = projector or GridSpec(out_width=target.hidden)
    folder.mkdir(parents=True, exist_ok=True)
    return write_grid_target(target, folder / "grid-target.gguf"), write_grid_projector(
        projector, folder / "mmproj-grid.gguf"
    )


# -- the Gemma 3 style: an image attended to all at once ------------------------------------------


@dataclass(frozen=True)
class PooledSpec:
    """mtmd's "gemma3": a SigLIP-style tower over image_size / patch_size patches a side, each
    pool x pool patches averaged into one row, RMS-normed and projected to the target's width.
    llama.cpp decodes its rows with causal attention off: every row sees the whole image."""

    out_width: int = 64
    width: int = 32
    heads: int = 2
    ffn: int = 48
    blocks: int = 1
    image_size: int = 32
    patch_size: int = 4
    pool: int = 2
    seed: int = 13
    scale: float = 4.0

    @property
    def positions(self) -> int:
        return (self.image_size // self.patch_size // self.pool) ** 2


def pooled_projector_tensors(spec: PooledSpec) -> dict[str, np.ndarray]:
    w = normal_weights(spec.seed)

    d, p, patches = spec.width, spec.patch_size, (spec.image_size // spec.patch_size) ** 2
    out = {
        "v.patch_embd.weight": w(d, 3, p, p, std=(3 * p * p) ** -0.5).astype(np.float16),
        "v.patch_embd.bias": w(d, std=0.1),
        "v.position_embd.weight": w(patches, d, std=0.5),
        "v.post_ln.weight": w(d, std=0.1, center=1.0),
        "v.post_ln.bias": w(d, std=0.1),
        "mm.soft_emb_norm.weight": w(d, std=0.1, center=1.0),
        "mm.input_projection.weight": w(d, spec.out_width, std=spec.scale * d**-0.5),
    }
    return out | tower_blocks(w, d, spec.ffn, spec.blocks)


def write_pooled_projector(spec: PooledSpec, path: Path) -> Path:
    writer = clip_writer(path, "gemma3", spec, spec.image_size)
    writer.add_uint32("clip.vision.projector.scale_factor", spec.pool)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return write_out(writer, pooled_projector_tensors(spec), path)


def write_pooled_pair(
    folder: Path, target: Spec | None = None, projector: PooledSpec | None = None
) -> tuple[Path, Path]:
    """(target GGUF, projector GGUF) of a tiny pair with a Gemma 3-style projector, widths
    matched. mtmd reads an image whole for the projector's type, whatever the target: the
    llama target of the LLaVA pair answers about an image more variedly than a tiny gemma3."""
    target = target or Spec(arch="llama")
    projector = projector or PooledSpec(out_width=target.hidden)
    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(target, folder / "pooled-target.gguf"), write_pooled_projector(
        projector, folder / "mmproj-pooled.gguf"
    )


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A random RGB PNG, written with zlib alone (no imaging package needed)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def write_png(path: Path, width: int = 24, height: int = 20, seed: int = 0) -> Path:
    path.write_bytes(png_bytes(width, height, seed))
    return path
