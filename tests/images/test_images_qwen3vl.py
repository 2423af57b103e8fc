"""Images on a Qwen3-VL-style pair: the projector ("qwen3vl_merger") gives each image row the
merged patches' features and, beside them, a deepstack feature per marked tower block; the
target ("qwen3vl", interleaved M-RoPE) reads a row n_embd * (1 + deepstack layers) wide and
adds each deepstack slice to the residual after the block of the same index. So the row the
backend hands llama.cpp is wider than the target's n_embd, and n-gram lookup on such a
prompt must still answer as plain decoding.

Written here with the gguf package from llama.cpp's tensor names (tools/mtmd/clip.cpp,
src/models/qwen3vl.cpp), random weights. The tiny target's answers repeat a token or two,
so the n-gram identity here is weak evidence on its own; what this file adds is that the
deepstack slices reach the target (an answer changes when only they are silenced) and that
their width is checked at load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localspec.api import load
from localspec.core.errors import ModelLoadError
from localspec.testing.gguf_writer import Spec, add_bpe_vocab, add_decoder_header, gguf_name, hf_weights, write_out
from localspec.testing.vision_writer import (
    GRID_ROPE_SECTIONS,
    GridSpec,
    clip_writer,
    normal_weights,
    png_bytes,
    tower_blocks,
)

N = 24
DEEPSTACK = (0,)  # the tower blocks whose output also goes to the target, each as a slice of the row
TARGET = Spec(arch="qwen2")  # weights drawn as a Qwen2 decoder's; its biases left out
TOWER = GridSpec(out_width=TARGET.hidden, blocks=2, seed=17)


def write_projector(spec: GridSpec, path: Path, deepstack: tuple[int, ...] = DEEPSTACK, loudness: float = 1.0) -> Path:
    """loudness scales the deepstack features (0: slices of zeros, the main rows unchanged)."""
    w = normal_weights(spec.seed)
    d, p, merged, out = spec.width, spec.patch_size, 4 * spec.width, spec.out_width
    conv_std = (2 * 3 * p * p) ** -0.5  # two kernels (two video frames) add on a still image
    grid = 4  # the learnt position grid, resized to the image's patches
    tensors = {
        "v.patch_embd.weight": w(d, 3, p, p, std=conv_std).astype(np.float16),
        "v.patch_embd.weight.1": w(d, 3, p, p, std=conv_std).astype(np.float16),
        "v.patch_embd.bias": w(d, std=0.1),
        "v.position_embd.weight": w(grid * grid, d, std=0.5),
        "mm.0.weight": w(merged, merged, std=merged**-0.5),
        "mm.0.bias": w(merged, std=0.1),
        "mm.2.weight": w(out, merged, std=spec.scale * merged**-0.5),
        "mm.2.bias": w(out, std=0.1 * spec.scale),
    } | tower_blocks(w, d, spec.ffn, spec.blocks, fused_qkv=True)
    for i in deepstack:
        s = f"v.deepstack.{i}."
        tensors |= {
            s + "norm.weight": w(merged, std=0.1, center=1.0),
            s + "norm.bias": w(merged, std=0.1),
            s + "fc1.weight": w(merged, merged, std=merged**-0.5),
            s + "fc1.bias": w(merged, std=0.1),
            s + "fc2.weight": loudness * w(out, merged, std=spec.scale * merged**-0.5),
            s + "fc2.bias": loudness * w(out, std=0.1 * spec.scale),
        }
    writer = clip_writer(path, "qwen3vl_merger", spec, grid * p)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return write_out(writer, tensors, path)


def write_target(spec: Spec, path: Path) -> Path:
    """A Qwen3 decoder (Q and K RMS-normed per head, no biases) as llama.cpp's "qwen3vl"."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen3vl")
    add_decoder_header(writer, spec.n_ctx, spec.hidden, spec.layers, spec.ffn, spec.heads, spec.kv_heads, spec.head_dim)
    writer.add_chat_template(spec.chat_template)
    writer.add_rope_freq_base(10_000.0)
    writer.add_array("qwen3vl.rope.dimension_sections", GRID_ROPE_SECTIONS)
    writer.add_uint32("qwen3vl.n_deepstack_layers", len(DEEPSTACK))
    vocab = add_bpe_vocab(writer, pre="qwen2")
    weights = {k: v for k, v in hf_weights(spec, vocab).items() if not k.endswith("_proj.bias")}
    rng = np.random.default_rng(spec.seed + 1)
    for i in range(spec.layers):
        for norm in ("q_norm", "k_norm"):
            weights[f"model.layers.{i}.self_attn.{norm}.weight"] = (1 + rng.normal(0, 0.1, spec.head_dim)).astype(
                np.float32
            )
    return write_out(writer, {gguf_name(name, spec): w for name, w in weights.items()}, path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qwen3vl")
    return write_target(TARGET, folder / "qwen3vl.gguf"), write_projector(TOWER, folder / "mmproj-qwen3vl.gguf")


def chat(seed: int) -> list[dict[str, Any]]:
    image = {"type": "image", "data": png_bytes(24, 20, seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": "Describe it"}]}]


def answers(pair: tuple[Path, Path], strategy: str, seeds: tuple[int, ...]) -> list[Any]:
    with load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1) as runtime:
        return [runtime.generate(messages=chat(seed), max_tokens=N, temperature=0) for seed in seeds]


def test_the_image_changes_the_answer(pair: tuple[Path, Path]) -> None:
    first, second = answers(pair, "none", (0, 3))
    assert first.tokens != second.tokens


def test_the_deepstack_slices_reach_the_target(pair: tuple[Path, Path], tmp_path: Path) -> None:
    # The same projector with its deepstack features silenced: the main rows are the same, and
    # the answer differs only if the target added the slices to its residual stream.
    silent = write_projector(TOWER, tmp_path / "mmproj-silent.gguf", loudness=0.0)
    assert answers(pair, "none", (0,))[0].tokens != answers((pair[0], silent), "none", (0,))[0].tokens


def test_a_projector_without_deepstack_is_refused_by_a_target_that_reads_it(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    narrow = write_projector(TOWER, tmp_path / "mmproj-narrow.gguf", deepstack=())
    with pytest.raises(ModelLoadError, match="could not load the projector") as refused:
        load(str(pair[0]), mmproj=str(narrow), strategy="none", calibrate=False, n_ctx=256, threads=1)
    assert f"{2 * TARGET.hidden} wide" in str(refused.value.hint)


@pytest.mark.parametrize("seed", [0, 3])
def test_ngram_lookup_on_a_deepstack_image_prompt_answers_as_plain_decoding(pair: tuple[Path, Path], seed: int) -> None:
    (expected,) = answers(pair, "none", (seed,))
    (result,) = answers(pair, "ngram", (seed,))
    assert result.tokens == expected.tokens
    assert result.stats.drafted > 0 and not result.stats.notices
