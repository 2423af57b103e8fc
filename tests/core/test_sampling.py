"""The logit-processing chain and the acceptance rules, on hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.acceptance import accept_greedy, accept_rejection_sampling
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import SamplingConfig, process


def test_min_p_top_k_and_top_p_truncate_before_temperature() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.04, 0.01]))
    dist = process(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=1.0, min_p=0.05))
    assert list(dist.ids) == [0, 1, 2]
    assert dist.probs.sum() == pytest.approx(1.0)
    assert dist.probs[0] == pytest.approx(0.5 / 0.95)
    nucleus = process(logits, SamplingConfig(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    assert list(nucleus.ids) == [0, 1]


def test_temperature_sharpens_within_the_kept_set() -> None:
    logits = np.log(np.array([0.6, 0.4]))
    cold = process(logits, SamplingConfig(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0))
    assert cold.probs[0] == pytest.approx(0.36 / 0.52)


@pytest.mark.parametrize(
    "bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"min_p": 1.0}, {"top_k": -2}, {"temperature": float("nan")}]
)
def test_bad_sampling_values_are_refused_with_a_clear_error(bad: dict[str, float]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingConfig(**bad)  # type: ignore[arg-type]


def test_greedy_acceptance_keeps_the_matching_prefix_and_adds_the_targets_token() -> None:
    logits = np.full((4, 6), -5.0)
    for row, best in enumerate([2, 3, 1, 5]):
        logits[row, best] = 5.0
    assert accept_greedy([2, 3, 4], logits) == (2, 1)
    assert accept_greedy([2, 3, 1], logits) == (3, 5)
    assert accept_greedy([], logits) == (0, 2)


def test_rejection_sampling_accepts_a_draft_the_target_is_sure_of() -> None:
    logits = np.full((2, 4), -30.0)
    logits[0, 1] = 0.0
    logits[1, 2] = 0.0
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    assert accept_rejection_sampling([1], None, logits, cfg, np.random.default_rng(0)) == (1, 2)


def test_rejection_sampling_never_returns_the_rejected_point_draft() -> None:
    logits = np.zeros((2, 3))  # uniform target
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    rng = np.random.default_rng(1)
    for _ in range(200):
        n, tok = accept_rejection_sampling([0], None, logits, cfg, rng)
        if n == 0:
            assert tok != 0
