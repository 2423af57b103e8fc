"""Images on a Qwen3.5-style target: recurrent layers (Gated DeltaNet) beside attention, and a
rotation with M-RoPE's sections, so an image's rows share one time position. Rollback there
restores recurrent state (backends/llamacpp/recurrent.py) and cuts the attention layers'
cache at positions, never inside an image; the target's own MTP head drafts on image prompts.

A tiny qwen35 target written by gguf_writer (its MTP block echoes its input token, so its
drafts are kept often and cut often) with the Qwen2-VL-style projector of vision_writer.py,
whose image takes fewer positions than rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_support import llamacpp_target
from test_images_mrope import mtmd_oracle
from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

from localspec.api import Runtime, load
from localspec.core.sampling import SamplingConfig
from localspec.prompts import Prompt
from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf
from localspec.testing.vision_writer import GridSpec, png_bytes, write_grid_projector

N = 24
OTHER = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qwen35-vision")
    target = write_qwen35_gguf(HybridSpec(nextn=1, mtp_echo=1.0), folder / "qwen35-mtp.gguf")
    return target, write_grid_projector(GridSpec(out_width=HybridSpec().hidden), folder / "mmproj-grid.gguf")


def fresh(pair: tuple[Path, Path], strategy: str, **options: Any) -> Runtime:
    return load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1, **options)


def chat(seed: int, text: str = "Describe it") -> list[dict[str, Any]]:
    image = {"type": "image", "data": png_bytes(24, 20, seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def plain_answers(pair: tuple[Path, Path]) -> dict[int, list[int]]:
    with fresh(pair, "none") as plain:
        return {s: list(plain.generate(messages=chat(s), max_tokens=N, temperature=0).tokens) for s in (0, OTHER)}


def test_an_image_prompt_is_evaluated_where_llama_cpps_mtmd_helper_places_it(pair: tuple[Path, Path]) -> None:
    image = png_bytes(24, 20, 0)
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        assert target._images is not None and target._places is not None  # qwen35 rotates by M-RoPE's sections
        text = f"Look: {target._images[0].marker} and say"
        ids = target.tokenize_images(text, [image], ["the image"])
        logits = np.array(target.eval_block(ids, "last"))[-1]
        expected, positions = mtmd_oracle(target, text, image)
        assert target._places.at(len(ids)) == positions
    np.testing.assert_allclose(logits, expected, atol=1e-3)


def test_the_image_changes_the_answer(plain_answers: dict[int, list[int]]) -> None:
    assert plain_answers[0] != plain_answers[OTHER]


def test_a_rollback_into_an_image_restores_the_state_a_fresh_evaluation_has(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        ids = runtime.prepare(messages=chat(0)).ids
        first = next(i for i, t in enumerate(ids) if t < 0)
        expected = np.array(target.eval_block(list(ids), "last")).copy()
        target.rollback(first + 5)
        assert target.n_past == first + 5
        again = np.array(target.eval_block(list(ids[first + 5 :]), "last"))
    np.testing.assert_allclose(again, expected, atol=1e-4)


def test_a_rollback_of_a_few_rows_into_the_image_just_decoded_takes_it_whole(pair: tuple[Path, Path]) -> None:
    # Within the last pass, a few rows back: llama.cpp's own snapshots would cut the cache
    # at a position, but the image's rows share one; the state goes back further instead.
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        ids = list(runtime.prepare(messages=chat(0)).ids)
        end = max(i for i, t in enumerate(ids) if t < 0) + 1
        expected = np.array(target.eval_block(ids, "last")).copy()
        target.rollback(0)
        target.eval_block(ids[:end], "none")  # the text, then the image's rows: the last pass
        target.rollback(end - 2)
        again = np.array(target.eval_block(ids[end - 2 :], "last"))
    np.testing.assert_allclose(again, expected, atol=1e-4)


@pytest.mark.parametrize("strategy", ["ngram", "mtp"])
def test_drafts_on_an_image_prompt_keep_plain_decodings_answer(
    pair: tuple[Path, Path], plain_answers: dict[int, list[int]], strategy: str
) -> None:
    with fresh(pair, strategy) as runtime:
        for seed in (0, OTHER, 0):  # the third reuses the first's cached prefix, image included
            result = runtime.generate(messages=chat(seed), max_tokens=N, temperature=0)
            assert list(result.tokens) == plain_answers[seed]
            assert result.stats.drafted > result.stats.accepted > 0  # kept and cut: the state restored


@pytest.fixture
def mtp(pair: tuple[Path, Path]) -> Iterator[Runtime]:
    with fresh(pair, "mtp", draft_tokens=2) as runtime:
        yield runtime


@pytest.mark.spec
def test_mtp_sampling_on_an_image_prompt_keeps_the_targets_joint_law(mtp: Runtime) -> None:
    # The prompt continues with the target's own greedy answer, which repeats: the echo head's
    # guess (its input token again) is then right often, and wrong often.
    ids = list(mtp.prepare(messages=chat(0)).ids)  # placeholder ids of this load's own projector
    ids += list(mtp.generate(prompt=Prompt(tuple(ids)), max_tokens=12, temperature=0).tokens)
    law = exact_first_two(mtp.target, ids, SamplingConfig(**SAMPLING))
    samples = sample_first_two(mtp, Prompt(tuple(ids)), 1000)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\nMTP sampling on an image prompt: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
