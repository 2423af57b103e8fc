"""Images read whole (Gemma 3's projector): llama.cpp decodes an image's rows with causal
attention off, so every row reads every other. localspec decodes such an image in one pass,
whatever block the engine asks for first: rows asked for later come from that pass, and a
rollback into the image takes it whole and decodes it again. Speculation stays exact.

A tiny pair written here: the llama target of the LLaVA pair and a "gemma3" projector (a
SigLIP-style tower, 2x2 patches pooled into a row; vision_writer.py). llama.cpp's own mtmd
helper is the oracle.
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

from localspec.api import Runtime, load, runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import SamplingConfig
from localspec.testing.vision_writer import PooledSpec, png_bytes, write_pooled_pair

N = 24
OTHER = 1  # an image seed whose answer differs from seed 0's
ROWS = PooledSpec().positions  # 16 rows an image


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pooled_pair(tmp_path_factory.mktemp("pooled"))


def fresh(pair: tuple[Path, Path], strategy: str, **options: Any) -> Runtime:
    return load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1, **options)


def in_blocks_of(pair: tuple[Path, Path], max_block: int) -> Runtime:
    """Plain decoding on a target whose passes take max_block rows: a prompt goes in in pieces."""
    target = LlamaCppBackend(str(pair[0]), n_ctx=256, threads=1, max_block=max_block)
    target.see_images(str(pair[1]))
    return runtime_for(target, strategy="none", calibrate=False)


def chat(seed: int, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    image = {"type": "image", "data": png_bytes(24, 20, seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


def answer(runtime: Runtime, messages: list[dict[str, Any]]) -> list[int]:
    return list(runtime.generate(messages=messages, max_tokens=N, temperature=0).tokens)


@pytest.fixture(scope="module")
def plain_answers(pair: tuple[Path, Path]) -> dict[int, list[int]]:
    with fresh(pair, "none") as plain:
        return {seed: answer(plain, chat(seed)) for seed in (0, OTHER)}


@pytest.mark.parametrize("seed", [0, OTHER])
def test_an_image_read_whole_is_evaluated_as_llama_cpps_mtmd_helper_does(pair: tuple[Path, Path], seed: int) -> None:
    image = png_bytes(24, 20, seed)
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        assert target._images is not None
        text = f"Look: {target._images[0].marker} and say"
        ids = target.tokenize_images(text, [image], ["the image"])
        logits = np.array(target.eval_block(ids, "last"))[-1]
        expected, _ = mtmd_oracle(target, text, image)
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_the_image_changes_the_answer(plain_answers: dict[int, list[int]]) -> None:
    assert plain_answers[0] != plain_answers[OTHER]


def test_a_prompt_whose_blocks_cut_the_image_answers_as_one_block_does(
    pair: tuple[Path, Path], plain_answers: dict[int, list[int]]
) -> None:
    runtime = in_blocks_of(pair, 16)  # the image's 16 rows straddle a block boundary
    with runtime:
        ids = runtime.prepare(messages=chat(0)).ids
        first = next(i for i, t in enumerate(ids) if t < 0)
        assert first % 16 != 0, "the image starts on a block boundary: its rows are not cut"
        assert answer(runtime, chat(0)) == plain_answers[0]


def test_a_rollback_into_the_image_leaves_the_cache_as_a_fresh_evaluation(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        ids = runtime.prepare(messages=chat(0)).ids
        first = next(i for i, t in enumerate(ids) if t < 0)
        expected = np.array(target.eval_block(list(ids), "last")).copy()
        target.rollback(first + 5)  # each row read the rest: the image goes whole and comes back whole
        assert target.n_past == first + 5
        again = np.array(target.eval_block(list(ids[first + 5 :]), "last"))
    np.testing.assert_allclose(again, expected, atol=1e-4)


def test_an_image_longer_than_a_pass_is_refused_naming_the_batch(tmp_path: Path) -> None:
    big = PooledSpec(image_size=48)  # 36 rows an image
    pair = write_pooled_pair(tmp_path, projector=big)
    with in_blocks_of(pair, big.positions) as runtime:  # a pass holds the image exactly: it is read
        assert len(answer(runtime, chat(0))) == N
    with in_blocks_of(pair, big.positions - 4) as runtime, pytest.raises(InvalidRequestError) as refused:
        runtime.generate(messages=chat(0), max_tokens=4)
    assert f"max_block={big.positions}" in str(refused.value.hint)


def test_an_image_asked_for_from_its_middle_is_refused_saying_where_to_start(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        assert target._images is not None
        ids = target.tokenize_images(f"a {target._images[0].marker} b", [png_bytes(24, 20, 0)], ["x"])
        rows = [t for t in ids if t < 0]
        with pytest.raises(InvalidRequestError) as refused:
            target.eval_block(rows[3:], "none")  # nothing before: its first rows were never read
        assert "from its first row" in str(refused.value.hint)


@pytest.mark.parametrize("seed", [0, OTHER])
def test_ngram_lookup_on_an_image_read_whole_answers_as_plain_decoding(
    pair: tuple[Path, Path], plain_answers: dict[int, list[int]], seed: int
) -> None:
    with fresh(pair, "ngram") as lookup:
        for _ in range(2):  # the second reuses the cached prefix, image included
            result = lookup.generate(messages=chat(seed), max_tokens=N, temperature=0)
            assert list(result.tokens) == plain_answers[seed]
            assert result.stats.drafted > 0


@pytest.fixture
def memory(pair: tuple[Path, Path]) -> Iterator[Runtime]:
    with fresh(pair, "ngram", draft_tokens=2, memory=True) as runtime:
        yield runtime


@pytest.mark.spec
def test_ngram_sampling_on_an_image_read_whole_keeps_the_targets_joint_law(memory: Runtime) -> None:
    memory.generate(messages=chat(OTHER), max_tokens=8, temperature=0)  # recalled and drafted below
    prompt = memory.prepare(messages=chat(OTHER))
    law = exact_first_two(memory.target, prompt.ids, SamplingConfig(**SAMPLING))
    samples = sample_first_two(memory, prompt, 1000)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\nn-gram sampling on an image read whole: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
