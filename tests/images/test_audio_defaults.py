"""Speculation on audio prompts as a user gets it: the default draft length ("auto"), priced
by the controller on a measured machine, calibration on (as test_images_defaults.py does for
images). The pair: a tiny audio target of 24 blocks that each add little (a "qwen2a"-type
projector beside it) and a draft model of its first two blocks, which agrees with it often
and costs a tenth of its pass. Each answer is plain decoding's, something is really drafted,
and sampling keeps the target's joint law of the first two tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_images_defaults import a_measured_machine  # noqa: F401  (the pinned probe, autouse)
from test_llamacpp_sampling import (
    P_FLOOR,
    SAMPLING,
    chi_square_p_value,
    exact_first_two,
    sample_first_two,
    worst_cells,
)

from localspec.api import Runtime, load
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.sampling import SamplingConfig
from localspec.testing.audio_writer import AudioSpec, wav_bytes, write_audio_pair
from localspec.testing.gguf_writer import Spec, write_gguf

N = 16  # tokens an answer
N_CTX = 1024  # a clip takes 750 positions (one 30 s window)
TARGET = Spec(arch="llama", layers=24, mix=0.3, embed_scale=0.5, n_ctx=N_CTX)
DRAFTER = replace(TARGET, layers=2)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("audio-defaults")
    target, projector = write_audio_pair(folder, TARGET, AudioSpec(out_width=TARGET.hidden))
    return {"target": target, "mmproj": projector, "draft": write_gguf(DRAFTER, folder / "draft.gguf")}


def at_defaults(files: dict[str, Path], strategy: str) -> Runtime:
    """As `localspec run --strategy STRATEGY -m TARGET --mmproj MMPROJ [--draft-model DRAFT] --ctx 1024`."""
    draft = str(files["draft"]) if strategy == "draft" else None
    return load(
        str(files["target"]), mmproj=str(files["mmproj"]), strategy=strategy, draft_model=draft, threads=1, n_ctx=N_CTX
    )


def question(pitch: float) -> list[dict[str, Any]]:
    clip = {"type": "input_audio", "input_audio": {"data": wav_bytes(pitch=pitch), "format": "wav"}}
    return [{"role": "user", "content": [clip, {"type": "text", "text": "What is said?"}]}]


@pytest.fixture(scope="module")
def plain_answer(files: dict[str, Path]) -> list[int]:
    with at_defaults(files, "none") as plain:
        return list(plain.generate(messages=question(440.0), max_tokens=N, temperature=0).tokens)


@pytest.mark.parametrize("strategy", ["ngram", "draft"])
def test_an_audio_prompt_at_the_default_draft_length_is_answered_as_plain_decoding(
    files: dict[str, Path], plain_answer: list[int], strategy: str
) -> None:
    with at_defaults(files, strategy) as runtime:
        assert isinstance(runtime.policy, AdaptiveDraftLength)  # "auto": priced per step, not fixed
        result = runtime.generate(messages=question(440.0), max_tokens=N, temperature=0)
    assert list(result.tokens) == plain_answer
    assert result.stats.drafted > 0 and not result.stats.notices


@pytest.mark.spec
def test_sampling_an_audio_prompt_with_a_draft_model_at_the_default_draft_length_keeps_the_joint_law(
    files: dict[str, Path],
) -> None:
    with at_defaults(files, "draft") as runtime:
        prompt = runtime.prepare(messages=question(440.0))  # the clip decoded once, not once a run
        law = exact_first_two(runtime.target, prompt.ids, SamplingConfig(**SAMPLING))
        # 600 runs, as the hybrid's, MTP's and EAGLE-3's laws take: this target's passes are
        # 24 blocks over a 750-position clip, four times an image prompt's.
        samples = sample_first_two(runtime, prompt, 600)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\ndefault-length draft model sampling an audio prompt: {samples.summary(law)}, p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    assert samples.whole_drafts > 0, "no draft was kept whole: the controller declined the drafter when sampling"
