"""Drafters beside the target on image prompts: a separate draft model drafts from the text
around the images (it cannot see them), and an EAGLE-3 head and a DFlash drafter read every
position through the target's own states. Each keeps the target's output exactly: greedy
answers are plain decoding's, and sampled ones keep the target's joint law of the first two
tokens (tests/specification/test_llamacpp_sampling.py's exact law and chi-square).

The tiny vision pair of tests/images/test_images.py; the draft model is its target's weights
perturbed a little, so it agrees with the target often: on text it is right almost always,
and on an image prompt it is right where the image leaves the answer as the text alone would
have it, and wrong (its guesses rolled back) where the image changes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

from localspec.api import Runtime, load
from localspec.core.sampling import SamplingConfig
from localspec.drafters.model import ModelDrafter
from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.vision_writer import png_bytes, write_vision_pair

N = 24  # tokens an answer
OTHER = 3  # an image seed whose answer differs from the text-only one early (tests/images/test_images.py)
TARGET = Spec(arch="llama")  # the vision pair's target (vision_writer.write_vision_pair)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vision-drafters")
    target, projector = write_vision_pair(folder)
    return {
        "target": target,
        "mmproj": projector,
        "draft": write_gguf(Spec(arch="llama", noise=0.05), folder / "draft.gguf"),
        "eagle3": write_eagle3_gguf(TARGET, HeadSpec(), folder / "eagle3.gguf"),
        "dflash": write_dflash_gguf(target, folder / "dflash.gguf", DFlashSpec(target_layers=(1, 2))),
    }


def opened(files: dict[str, Path], strategy: str, **options: Any) -> Runtime:
    drafter = {"draft": files["draft"], "eagle3": files["eagle3"], "dflash": files["dflash"]}.get(strategy)
    return load(
        str(files["target"]),
        mmproj=str(files["mmproj"]),
        strategy=strategy,
        draft_model=str(drafter) if drafter else None,
        calibrate=False,
        n_ctx=256,
        threads=1,
        **options,
    )


def question(seed: int | None, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    image = [] if seed is None else [{"type": "image", "data": png_bytes(24, 20, seed)}]
    return [{"role": "user", "content": [*image, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def plain_answers(files: dict[str, Path]) -> dict[int | None, list[int]]:
    with opened(files, "none") as plain:
        return {
            seed: list(plain.generate(messages=question(seed), max_tokens=N, temperature=0).tokens)
            for seed in (0, OTHER, None)
        }


# -- a separate draft model ------------------------------------------------------------------------


def test_the_draft_model_reads_the_prompts_text_with_the_image_positions_left_out(files: dict[str, Path]) -> None:
    with opened(files, "draft") as runtime:
        prompt = runtime.prepare(messages=question(0)).ids
        drafter = ModelDrafter(runtime.drafter.backend)  # type: ignore[attr-defined]
        drafter.start(prompt)
        text = [t for t in prompt if t >= 0]
        assert len(text) < len(prompt)  # the prompt holds an image
        # Its cache holds the text before the last token, which the first guess evaluates.
        assert list(drafter.backend.cached_tokens()) == text[:-1]


@pytest.mark.parametrize("seed", [0, OTHER])
def test_a_draft_model_on_an_image_prompt_answers_as_plain_decoding(
    files: dict[str, Path], plain_answers: dict[int | None, list[int]], seed: int
) -> None:
    with opened(files, "draft") as runtime:
        result = runtime.generate(messages=question(seed), max_tokens=N, temperature=0)
    assert list(result.tokens) == plain_answers[seed]
    assert result.stats.drafted > 0 and not result.stats.notices  # it drafted, and did not sit out


def test_a_draft_model_is_both_kept_and_rolled_back_on_image_prompts(files: dict[str, Path]) -> None:
    # On the image that changes the answer the drafter, which answers the text alone, is
    # often wrong: its cache is rolled back to the kept text many times over.
    with opened(files, "draft") as runtime:
        stats = [runtime.generate(messages=question(seed), max_tokens=N, temperature=0).stats for seed in (0, OTHER)]
        text = runtime.generate(messages=question(None), max_tokens=N, temperature=0).stats
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    print(f"\ndraft model, acceptance: image prompts {accepted}/{drafted}, text prompts {text.accepted}/{text.drafted}")
    assert 0 < accepted < drafted
    assert text.accepted / text.drafted > accepted / drafted  # the image is what it cannot see


def test_one_runtime_answers_images_then_text_exactly_as_plain_decoding(
    files: dict[str, Path], plain_answers: dict[int | None, list[int]]
) -> None:
    # The drafter's cache is reused across requests: a prefix it holds from one image's
    # prompt must not stand for another's text, nor the text-only prompt's.
    with opened(files, "draft") as runtime:
        for seed in (0, OTHER, None, 0):
            assert (
                list(runtime.generate(messages=question(seed), max_tokens=N, temperature=0).tokens)
                == plain_answers[seed]
            )


# -- heads that read the target's states ------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["eagle3", "dflash"])
@pytest.mark.parametrize("seed", [0, OTHER])
def test_a_drafter_reading_the_targets_states_answers_an_image_prompt_as_plain_decoding(
    files: dict[str, Path], plain_answers: dict[int | None, list[int]], strategy: str, seed: int
) -> None:
    with opened(files, strategy) as runtime:
        result = runtime.generate(messages=question(seed), max_tokens=N, temperature=0)
    assert list(result.tokens) == plain_answers[seed]
    assert result.stats.accepted > 0 and not result.stats.notices


def test_the_eagle3_head_reads_the_image_positions_as_the_target_holds_them(files: dict[str, Path]) -> None:
    # The head records the image's placeholder ids where the target does, so it takes the
    # target's states there (and after it) as known, and reads none of them again.
    with opened(files, "eagle3") as runtime:
        runtime.generate(messages=question(OTHER), max_tokens=4, temperature=0)
        head = runtime.drafter.backend  # type: ignore[attr-defined]
        held = list(head.cached_tokens())
        target = list(runtime.target.cached_tokens())
    assert min(held) < 0
    assert held == target[: len(held)]


# -- sampling keeps the target's law ----------------------------------------------------------------


@pytest.mark.spec
@pytest.mark.parametrize("strategy", ["draft", "eagle3", "dflash"])
def test_sampling_with_a_drafter_on_an_image_prompt_keeps_the_targets_joint_law(
    files: dict[str, Path], strategy: str
) -> None:
    with opened(files, strategy, draft_tokens=2) as runtime:
        # No confidence stop: at T = 1 the drafter's first guess is often unsure, and a draft
        # cut after it could never be kept whole.
        if isinstance(runtime.drafter, ModelDrafter):
            runtime.drafter.min_confidence = 0.0
        prompt = runtime.prepare(messages=question(OTHER))  # the image decoded once, not once a run
        law = exact_first_two(runtime.target, prompt.ids, SamplingConfig(**SAMPLING))
        samples = sample_first_two(runtime, prompt, 1000)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\n{strategy} sampling on an image prompt: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
