"""Speculative sampling on an image prompt draws the first two tokens from the target's own
law, as on text (tests/specification/test_llamacpp_sampling.py, whose exact law and chi-square test are used
here): the prompt's image positions are decoded from the projector's rows, and n-gram lookup
and the memory of earlier requests draft the text after them.

The tiny vision pair of tests/images/test_images.py, one thread; 1000 seeded runs a law (about 2 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_llamacpp_sampling import (
    P_FLOOR,
    SAMPLING,
    Samples,
    chi_square_p_value,
    exact_first_two,
    sample_first_two,
    worst_cells,
)

from localspec.api import Runtime, load
from localspec.core.sampling import SamplingConfig
from localspec.testing.vision_writer import png_bytes, write_vision_pair

pytestmark = pytest.mark.spec

RUNS = 1000
IMAGE = {"type": "image", "data": png_bytes(24, 20, seed=3)}
QUESTION: list[dict[str, Any]] = [
    {"role": "user", "content": [IMAGE, {"type": "text", "text": "What is in the picture?"}]}
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_vision_pair(tmp_path_factory.mktemp("vision"))


@pytest.fixture
def lookup(pair: tuple[Path, Path], request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """n-gram lookup with γ = 2; the memory of earlier requests as the test's parameter says."""
    memory: bool = request.param
    with load(
        str(pair[0]),
        mmproj=str(pair[1]),
        strategy="ngram",
        draft_tokens=2,
        calibrate=False,
        n_ctx=256,
        threads=1,
        memory=memory,
    ) as runtime:
        yield runtime


def sample_law(rt: Runtime, messages: list[dict[str, Any]], what: str) -> Samples:
    prompt = rt.prepare(messages=messages)  # the image decoded once, not once a run
    assert min(prompt.ids) < 0, "the prompt holds no image positions"
    law = exact_first_two(rt.target, prompt.ids, SamplingConfig(**SAMPLING))
    samples = sample_first_two(rt, prompt, RUNS)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\n{what}: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    return samples


@pytest.mark.parametrize("lookup", [False], indirect=True)
def test_ngram_lookup_on_a_follow_up_about_an_image_keeps_the_targets_joint_law(lookup: Runtime) -> None:
    # The earlier answer "\n\n" (the target's likeliest first two tokens here) is what the
    # lookup guesses after the second "assistant" header: kept whole often, cut often.
    follow_up: list[dict[str, Any]] = [
        *QUESTION,
        {"role": "assistant", "content": "\n\n"},
        {"role": "user", "content": "And now?"},
    ]
    samples = sample_law(lookup, follow_up, "n-gram sampling on an image prompt")
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"


@pytest.mark.parametrize("lookup", [True], indirect=True)
def test_the_memory_of_an_earlier_answer_about_the_image_keeps_the_targets_joint_law(lookup: Runtime) -> None:
    # The prompt alone gives the lookup nothing to copy (a first step never keeps two drafted
    # tokens without the memory: see the assertion); the earlier greedy answer about the
    # same image is recalled across the image's positions and drafted.
    lookup.generate(messages=QUESTION, max_tokens=8, temperature=0)
    samples = sample_law(lookup, QUESTION, "memory sampling on an image prompt")
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"


@pytest.mark.parametrize("lookup", [False], indirect=True)
def test_without_the_memory_the_image_question_drafts_nothing_kept_whole(lookup: Runtime) -> None:
    # The control for the test above: its whole drafts are the memory's.
    samples = sample_first_two(lookup, lookup.prepare(messages=QUESTION), 200)  # type: ignore[arg-type]
    assert samples.whole_drafts == 0
