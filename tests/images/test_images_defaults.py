"""Speculation on image prompts as a user gets it: the default draft length ("auto"), priced by
the controller on this machine's costs, not the fixed length and calibration off that the
other image tests use to exercise acceptance. Each answer is plain decoding's, and each test
checks that something was really drafted, so that none passes by the controller declining.

The pair: a tiny vision target of 24 blocks that each add little to the residual (close to a
bigram model, whose answer the image still changes), and a draft model of its first two
blocks (the same seed draws the same embeddings and blocks), which agrees with it often and
costs a tenth of its pass. The machine is the one `localspec doctor` measured (45 GB/s, 128
GFLOPS): the draft length is the machine's choice, and a busy host's quick probe would
otherwise decide whether anything is drafted at all.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_llamacpp_sampling import (
    P_FLOOR,
    SAMPLING,
    chi_square_p_value,
    exact_first_two,
    sample_first_two,
    worst_cells,
)

from localspec.api import Runtime, load
from localspec.backends.llamacpp.copies import derived
from localspec.control import calibrate, hardware
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.sampling import SamplingConfig
from localspec.events import Completion
from localspec.pool import load_pool
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.vision_writer import png_bytes, write_vision_pair

N = 24  # tokens an answer
SEEDS = (0, 3)  # images whose answers differ (test_the_images_change_the_answer)
TARGET = Spec(arch="llama", layers=24, mix=0.3, embed_scale=0.5)
DRAFTER = replace(TARGET, layers=2)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vision-defaults")
    target, projector = write_vision_pair(folder, TARGET)
    return {"target": target, "mmproj": projector, "draft": write_gguf(DRAFTER, folder / "draft.gguf")}


@pytest.fixture(autouse=True)
def a_measured_machine(temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device probe cached as `localspec doctor` leaves it, from fixed measurements."""
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda threads: 45.0)
    monkeypatch.setattr(hardware, "measure_gflops", lambda: 128.0)
    monkeypatch.setattr(hardware, "probe_accelerators", lambda: ())
    hardware.probe(refresh=True)


def at_defaults(files: dict[str, Path], strategy: str) -> Runtime:
    """As `localspec run --strategy STRATEGY -m TARGET --mmproj MMPROJ [--draft-model DRAFT]`."""
    draft = str(files["draft"]) if strategy == "draft" else None
    return load(str(files["target"]), mmproj=str(files["mmproj"]), strategy=strategy, draft_model=draft, threads=1)


def question(seed: int) -> list[dict[str, Any]]:
    image = {"type": "image", "data": png_bytes(24, 20, seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": "What is in the picture?"}]}]


@pytest.fixture(scope="module")
def plain_answers(files: dict[str, Path]) -> dict[int, list[int]]:
    with load(str(files["target"]), mmproj=str(files["mmproj"]), strategy="none", threads=1) as plain:
        return {
            seed: list(plain.generate(messages=question(seed), max_tokens=N, temperature=0).tokens) for seed in SEEDS
        }


def test_the_images_change_the_answer(plain_answers: dict[int, list[int]]) -> None:
    # Without this, an answer that ignored the image could pass the identity tests below.
    assert plain_answers[SEEDS[0]] != plain_answers[SEEDS[1]]


@pytest.mark.parametrize("seed", SEEDS)
def test_ngram_lookup_at_the_default_draft_length_answers_an_image_prompt_as_plain_decoding(
    files: dict[str, Path], plain_answers: dict[int, list[int]], seed: int
) -> None:
    with at_defaults(files, "ngram") as runtime:
        assert isinstance(runtime.policy, AdaptiveDraftLength)  # "auto": priced per step, not fixed
        result = runtime.generate(messages=question(seed), max_tokens=N, temperature=0)
    assert list(result.tokens) == plain_answers[seed]
    assert result.stats.drafted > 0 and not result.stats.notices


@pytest.mark.parametrize("seed", SEEDS)
def test_a_draft_model_at_the_default_draft_length_answers_an_image_prompt_as_plain_decoding(
    files: dict[str, Path], plain_answers: dict[int, list[int]], seed: int
) -> None:
    with at_defaults(files, "draft") as runtime:
        policy = runtime.policy
        assert isinstance(policy, AdaptiveDraftLength)
        assert runtime.draft is not None
        assert policy.prior == calibrate.pair_agreement(runtime.target, runtime.draft)  # measured at load
        result = runtime.generate(messages=question(seed), max_tokens=N, temperature=0)
    assert list(result.tokens) == plain_answers[seed]
    stats = result.stats
    assert stats.drafted - stats.lookup_drafted > 0, "the draft model drafted nothing: the controller declined it"
    assert not stats.notices


@pytest.mark.spec
def test_sampling_with_a_draft_model_at_the_default_draft_length_keeps_the_targets_joint_law(
    files: dict[str, Path],
) -> None:
    # The controller prices each step's γ (0 too) from what it has learnt so far, so the runs
    # draft differently from one another; each run's first two tokens must follow the law.
    with at_defaults(files, "draft") as runtime:
        prompt = runtime.prepare(messages=question(SEEDS[1]))  # the image decoded once, not once a run
        law = exact_first_two(runtime.target, prompt.ids, SamplingConfig(**SAMPLING))
        samples = sample_first_two(runtime, prompt, 1000)  # type: ignore[arg-type]
    p = chi_square_p_value(samples.counts, law)
    print(f"\ndefault-length draft model sampling an image prompt: {samples.summary(law)}, p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    # A first step of 3 tokens kept a two-token draft whole (max_tokens=3 caps γ at 2): the
    # controller drafted at T > 0. Rejections at T > 0 are test_images_drafters.py's, at a fixed γ.
    assert samples.whole_drafts > 0, "no draft was kept whole: the controller declined the drafter when sampling"


def together(ask: Any, seeds: tuple[int, ...]) -> list[Completion]:
    """ask(seed) for every seed, each from a thread of its own, all sent at the same moment."""
    answers: list[Completion | None] = [None] * len(seeds)
    start = threading.Barrier(len(seeds))

    def client(i: int) -> None:
        start.wait(60)
        answers[i] = ask(seeds[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(seeds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(answer is not None for answer in answers), "a client failed (its exception is printed above)"
    return [answer for answer in answers if answer is not None]


def test_two_lanes_at_the_default_draft_length_answer_image_prompts_at_once_as_each_alone(
    files: dict[str, Path],
) -> None:
    # As `localspec serve --parallel 2 --mmproj MMPROJ --strategy ngram`: calibration on, "auto"
    # draft lengths priced on passes the lanes share. A Q8_0 target, so that a pass holds
    # several rows and the two lanes' steps can meet in one. Alone: plain decoding of the same
    # request on its own runtime, so the lanes start cold and their prompts overlap in time.
    target = derived(files["target"], "Q8_0", files["target"].parent)
    pairs = (SEEDS, (1, 4), (2, 5))  # images whose answers differ, two at a time
    with load(str(target), mmproj=str(files["mmproj"]), strategy="none", threads=1) as plain:
        alone = {
            seed: list(plain.generate(messages=question(seed), max_tokens=N, temperature=0).tokens)
            for pair in pairs
            for seed in pair
        }
    with load_pool(str(target), mmproj=str(files["mmproj"]), parallel=2, strategy="ngram", threads=1) as pool:
        assert len(pool.runtimes) == 2 and pool.note is None
        assert all(isinstance(runtime.policy, AdaptiveDraftLength) for runtime in pool.runtimes)
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]

        def ask(seed: int) -> Completion:
            return pool.generate(messages=question(seed), max_tokens=N, temperature=0)

        # n-gram lookup has little to draft from in a first answer (later ones recall earlier
        # answers), and on a busy host two requests may pass without meeting in a pass: rounds
        # run (each checked) until one both drafted and shared passes, the pairs asked again
        # where none did (a pair asked again recalls its answers, so it drafts).
        for pair in (*pairs, *pairs):
            assert alone[pair[0]] != alone[pair[1]]  # a lane reading the other's image would show
            shared_before = host.figures.shared_passes
            answers = together(ask, pair)
            assert [list(answer.tokens) for answer in answers] == [alone[seed] for seed in pair]
            assert not any(answer.stats.notices for answer in answers)
            drafted = sum(answer.stats.drafted for answer in answers)
            if host.figures.shared_passes > shared_before and drafted > 0:
                break
        assert host.figures.shared_passes > shared_before, "the two requests never shared a pass"
        assert drafted > 0, "nothing was drafted: the controller declined every draft"
