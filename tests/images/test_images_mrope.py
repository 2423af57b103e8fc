"""Images on M-RoPE's grid (the Qwen-VL family): a target whose rotation has time, height and
width sections places an image's nx * ny rows at one time position, on its grid, and the text
after it max(nx, ny) positions later. Record index and position part there; the cache, the
rollback and prefix reuse must follow positions, and speculation must stay exact.

A tiny Qwen2-VL-style pair written here (a "qwen2vl" target and a "qwen2vl_merger" projector,
random weights; vision_writer.py); llama.cpp's own mtmd helper is the oracle for positions.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_support import llamacpp_target
from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

from localspec.api import Runtime, load
from localspec.backends.llamacpp import library
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.sampling import SamplingConfig
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.vision_writer import png_bytes, write_grid_pair

N = 24
TEXT = "Describe it"  # on this seed's pair, each image's answer changes token part-way: drafts are cut
OTHER = 3  # an image seed whose answer differs from seed 0's


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_grid_pair(tmp_path_factory.mktemp("grid"), Spec(arch="qwen2", seed=2))


def fresh(pair: tuple[Path, Path], strategy: str, **options: Any) -> Runtime:
    return load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1, **options)


def chat(seed: int, text: str = TEXT) -> list[dict[str, Any]]:
    image = {"type": "image", "data": png_bytes(24, 20, seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


def answer(runtime: Runtime, messages: list[dict[str, Any]]) -> list[int]:
    return list(runtime.generate(messages=messages, max_tokens=N, temperature=0).tokens)


# -- positions: as llama.cpp's own mtmd helper places them --------------------------------------


def mtmd_oracle(target: LlamaCppBackend, text: str, image: bytes) -> tuple[np.ndarray, int]:
    """The last row's logits and the next position after llama.cpp's mtmd_helper_eval_chunks
    evaluates text (the image at the projector's marker) in a context of its own."""
    llama = library.llama
    projector = target._images[0] if target._images else None  # the load's own mtmd context
    assert projector is not None
    m, mctx = projector._m, projector._ctx
    params = llama.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_threads, params.n_threads_batch = 256, 256, 256, 1, 1
    lctx = llama.llama_init_from_model(target._model, params)
    raw = text.encode()
    given = m.mtmd_input_text(text=raw, text_len=len(raw), add_special=False, parse_special=True)
    buf = (ctypes.c_uint8 * len(image)).from_buffer_copy(image)
    bitmap = m.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(image), False, m.mtmd_helper_init_opt_default())
    chunks = m.mtmd_input_chunks_init()
    try:
        assert m.mtmd_tokenize(mctx, chunks, ctypes.byref(given), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        n_past = llama.llama_pos(0)
        assert m.mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, 256, True, ctypes.byref(n_past)) == 0
        n_vocab = target.info.n_vocab
        logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()
        return logits, int(n_past.value)
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        llama.llama_free(lctx)


@pytest.mark.parametrize("seed", [0, OTHER])
def test_an_image_prompt_is_evaluated_where_llama_cpps_mtmd_helper_places_it(
    pair: tuple[Path, Path], seed: int
) -> None:
    image = png_bytes(24, 20, seed)
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        assert target._images is not None
        text = f"Look: {target._images[0].marker} and say"
        ids = target.tokenize_images(text, [image], ["the image"])
        rows = sum(1 for t in ids if t < 0)
        logits = np.array(target.eval_block(ids, "last"))[-1]
        expected, positions = mtmd_oracle(target, text, image)
        assert target._places is not None and target._places.at(len(ids)) == positions
    assert positions < len(ids) and rows > 1  # the image takes fewer positions than rows
    np.testing.assert_allclose(logits, expected, atol=1e-3)


def test_a_rollback_into_an_image_leaves_the_cache_as_a_fresh_evaluation(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        ids = runtime.prepare(messages=chat(0)).ids
        first = next(i for i, t in enumerate(ids) if t < 0)
        expected = np.array(target.eval_block(list(ids), "last")).copy()
        target.rollback(first + 5)  # its rows share one position: the image goes whole, its first 5 come back
        assert target.n_past == first + 5
        again = np.array(target.eval_block(list(ids[first + 5 :]), "last"))
    np.testing.assert_allclose(again, expected, atol=1e-4)


def test_a_tree_after_an_image_gives_each_node_its_root_paths_rows_and_keeps_one_branch(
    pair: tuple[Path, Path],
) -> None:
    # Branches verified in one pass sit at the text's positions after the image (not at
    # record indices): each node's rows are a chain's over its root path, and the kept
    # branch leaves the cache as that chain would.
    with fresh(pair, "none") as runtime:
        target = llamacpp_target(runtime)
        ids = list(runtime.prepare(messages=chat(0)).ids)
        tokens, parents = [ids[-1], 13, 118, 13, 49], [-1, 0, 1, 0, 3]
        target.eval_block(ids[:-1], "none")
        tree = np.array(target.eval_tree(tokens, parents)).copy()
        target.keep_branch([0, 3, 4])
        after = np.array(target.eval_block([137], "last")).copy()
        for path in ([0, 1, 2], [0, 3, 4]):
            target.rollback(len(ids) - 1)
            chain = np.array(target.eval_block([tokens[i] for i in path], "all")).copy()
            np.testing.assert_allclose(tree[path], chain, atol=2e-2)
        expected = np.array(target.eval_block([137], "last"))
    np.testing.assert_allclose(after, expected, atol=2e-2)


# -- speculation on an image prompt is lossless ---------------------------------------------------


def test_the_image_changes_the_answer(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "none") as plain:
        assert answer(plain, chat(0)) != answer(plain, chat(OTHER))


@pytest.mark.parametrize("seed", [0, OTHER])
def test_ngram_lookup_on_a_grid_image_prompt_answers_as_plain_decoding(pair: tuple[Path, Path], seed: int) -> None:
    with fresh(pair, "none") as plain, fresh(pair, "ngram") as lookup:
        expected = answer(plain, chat(seed))
        result = lookup.generate(messages=chat(seed), max_tokens=N, temperature=0)
    assert list(result.tokens) == expected
    assert result.stats.drafted > result.stats.accepted > 0  # drafts kept and cut: rollbacks after the image


def test_a_draft_model_on_a_grid_image_prompt_answers_as_plain_decoding(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # It reads the text around the image (its own positions, one a token); the target's stay the grid's.
    draft = write_gguf(Spec(arch="qwen2", seed=2, noise=0.05), tmp_path / "draft.gguf")
    with fresh(pair, "none") as plain, fresh(pair, "draft", draft_model=str(draft)) as drafted:
        for seed in (0, OTHER):
            result = drafted.generate(messages=chat(seed), max_tokens=N, temperature=0)
            assert list(result.tokens) == answer(plain, chat(seed))
            assert result.stats.drafted > result.stats.accepted > 0


@pytest.fixture(scope="module")
def seeing(pair: tuple[Path, Path]) -> Iterator[Runtime]:
    runtime = fresh(pair, "ngram")
    yield runtime
    runtime.close()


def test_a_follow_up_about_the_same_image_reuses_its_prefix_and_answers_as_a_fresh_runtime(
    pair: tuple[Path, Path], seeing: Runtime
) -> None:
    first = seeing.generate(messages=chat(0), max_tokens=N, temperature=0)
    follow_up = [*chat(0), {"role": "assistant", "content": first.text}, {"role": "user", "content": "And now?"}]
    result = seeing.generate(messages=follow_up, max_tokens=N, temperature=0, reuse_prefix="any")
    with fresh(pair, "none") as plain:
        expected = answer(plain, follow_up)
    assert result.stats.reused_tokens > 0
    assert list(result.tokens) == expected


def test_a_cached_prefix_with_another_image_is_not_reused(pair: tuple[Path, Path], seeing: Runtime) -> None:
    seeing.generate(messages=chat(0), max_tokens=4, temperature=0)
    result = seeing.generate(messages=chat(OTHER), max_tokens=N, temperature=0, reuse_prefix="any")
    with fresh(pair, "none") as plain:
        assert list(result.tokens) == answer(plain, chat(OTHER))


@pytest.mark.spec
def test_ngram_sampling_on_a_grid_image_prompt_keeps_the_targets_joint_law(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "ngram", draft_tokens=2, memory=True) as lookup:
        # The earlier greedy answer about the same image is recalled across the image's rows and
        # drafted: its first two tokens are the likeliest pair, kept whole often, cut often.
        lookup.generate(messages=chat(0), max_tokens=8, temperature=0)
        prompt = lookup.prepare(messages=chat(0))
        law = exact_first_two(lookup.target, prompt.ids, SamplingConfig(**SAMPLING))
        samples = sample_first_two(lookup, prompt, 1000)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\nn-gram sampling on a grid image prompt: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
