"""Images on a Gemma 4 pair: the "gemma4" target and a "gemma4v" projector (a ViT whose
patches take learnt x and y position tables and a 2-D rotation, RMS norms before and after
each half-block, V normed too; each 3x3 patches averaged into one row, RMS-normed and
projected to the target's width). mtmd resizes an image to at least 70 rows, and reads them
whole (causal attention off while they are decoded) for every target but Gemma 4's E2B and
E4B widths, so the tiny pair's images are read whole, as Gemma 3's are (test_images_whole.py).

Written here with the gguf package from llama.cpp's tensor names (tools/mtmd/clip.cpp,
tools/mtmd/models/gemma4v.cpp), random weights; the target is gguf_writer's tiny Gemma 4
(sliding-window blocks, the last one full). llama.cpp's own mtmd helper is the oracle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_support import llamacpp_target
from test_images_mrope import mtmd_oracle

from localspec.api import Runtime, load
from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair, write_out
from localspec.testing.vision_writer import PooledSpec, clip_writer, normal_weights, png_bytes

N = 24
SEEDS = (0, 3)  # images whose answers differ (test_the_image_changes_the_answer)
TARGET = Gemma4Spec(seed=1, head_scale=8.0)  # sharp enough that answers vary (19 tokens of 24 distinct)
TOWER = PooledSpec(out_width=TARGET.hidden, patch_size=4, pool=3, seed=19)  # a row: 12x12 pixels
POSITIONS = 64  # rows of each learnt position table (x, y): more patches a side than any image here


def tower(w: Any, d: int, ffn: int, blocks: int, head_dim: int) -> dict[str, np.ndarray]:
    """Gemma 4's vision blocks as clip.cpp's build_vit reads them: RMS norms without biases,
    Q and K normed per head, a norm after attention and after the gated FFN."""
    out: dict[str, np.ndarray] = {}
    for i in range(blocks):
        b = f"v.blk.{i}."
        out |= {b + part + ".weight": w(d, d, std=d**-0.5) for part in ("attn_q", "attn_k", "attn_v", "attn_out")}
        out |= {
            b + norm + ".weight": w(d, std=0.1, center=1.0)
            for norm in ("ln1", "ln2", "attn_post_norm", "ffn_post_norm")
        }
        out |= {
            b + "attn_q_norm.weight": w(head_dim, std=0.1, center=1.0),
            b + "attn_k_norm.weight": w(head_dim, std=0.1, center=1.0),
            b + "ffn_gate.weight": w(ffn, d, std=d**-0.5),
            b + "ffn_up.weight": w(ffn, d, std=d**-0.5),
            b + "ffn_down.weight": w(d, ffn, std=ffn**-0.5),
        }
    return out


def write_projector(spec: PooledSpec, path: Path) -> Path:
    w = normal_weights(spec.seed)
    d, p = spec.width, spec.patch_size
    tensors = {
        "v.patch_embd.weight": w(d, 3, p, p, std=(3 * p * p) ** -0.5).astype(np.float16),  # no bias
        "v.position_embd.weight": w(2, POSITIONS, d, std=0.5),  # the x table, then the y table
        "v.std_bias": w(d, std=0.1),
        "v.std_scale": w(d, std=0.1, center=1.0),
        "mm.input_projection.weight": w(spec.out_width, d, std=spec.scale * d**-0.5),
    } | tower(w, d, spec.ffn, spec.blocks, d // spec.heads)
    writer = clip_writer(path, "gemma4v", spec, spec.image_size)
    writer.add_uint32("clip.vision.projector.scale_factor", spec.pool)
    writer.add_array("clip.vision.image_mean", [0.0, 0.0, 0.0])
    writer.add_array("clip.vision.image_std", [1.0, 1.0, 1.0])
    return write_out(writer, tensors, path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("gemma4v")
    target, _ = write_gemma4_pair(TARGET, folder)  # its assistant is not used here
    return target, write_projector(TOWER, folder / "mmproj-gemma4v.gguf")


def fresh(pair: tuple[Path, Path], strategy: str) -> Runtime:
    return load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1)


def chat(seed: int) -> list[dict[str, Any]]:
    image = {"type": "image", "data": png_bytes(24, 20, seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": "Describe it"}]}]


@pytest.fixture(scope="module")
def plain_answers(pair: tuple[Path, Path]) -> dict[int, list[int]]:
    with fresh(pair, "none") as plain:
        return {seed: list(plain.generate(messages=chat(seed), max_tokens=N, temperature=0).tokens) for seed in SEEDS}


def test_a_gemma4v_image_is_read_whole_and_evaluated_as_llama_cpps_mtmd_helper_does(pair: tuple[Path, Path]) -> None:
    image = png_bytes(24, 20, SEEDS[1])
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        assert target._images is not None and target._images[0].reads_whole
        text = f"Look: {target._images[0].marker} and say"
        ids = target.tokenize_images(text, [image], ["the image"])
        assert sum(1 for t in ids if t < 0) >= 70  # mtmd's least for gemma4v: the small image is enlarged
        logits = np.array(target.eval_block(ids, "last"))[-1]
        expected, _ = mtmd_oracle(target, text, image)
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_the_image_changes_the_answer(plain_answers: dict[int, list[int]]) -> None:
    assert plain_answers[SEEDS[0]] != plain_answers[SEEDS[1]]


@pytest.mark.parametrize("seed", SEEDS)
def test_ngram_lookup_on_a_gemma4v_image_prompt_answers_as_plain_decoding(
    pair: tuple[Path, Path], plain_answers: dict[int, list[int]], seed: int
) -> None:
    with fresh(pair, "ngram") as lookup:
        result = lookup.generate(messages=chat(seed), max_tokens=N, temperature=0)
    assert list(result.tokens) == plain_answers[seed]
    assert result.stats.drafted > 0 and not result.stats.notices
