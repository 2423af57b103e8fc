"""The pair agreement that seeds a model drafter's acceptance estimates: measured once per
pair and machine, and where the controller starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec import calibrate
from localspec.api import Runtime
from localspec.backends.reference import load
from localspec.controller import AdaptiveDraftLength


def test_a_close_drafter_agrees_more_than_a_distant_one(temporary_localspec_home: Path) -> None:
    target = load("reference:seed=3")
    close = calibrate.pair_agreement(target, load("reference:seed=3,noise=0.1"))
    distant = calibrate.pair_agreement(target, load("reference:seed=3,noise=2.0"))
    assert 0.0 <= distant < close <= 1.0
    assert calibrate.pair_agreement(target, load("reference:seed=3")) == 1.0  # the target itself


def test_the_agreement_is_measured_once(temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = load("reference:seed=3"), load("reference:seed=3,noise=0.3")
    first = calibrate.pair_agreement(target, draft)
    monkeypatch.setattr(calibrate, "agreement", lambda *args: pytest.fail("measured again"))
    assert calibrate.pair_agreement(target, draft) == first


def test_a_model_drafter_starts_from_the_measured_agreement(temporary_localspec_home: Path) -> None:
    target, draft = load("reference:seed=3"), load("reference:seed=3,noise=0.3")
    policy = Runtime(target, draft, strategy="draft").policy
    assert isinstance(policy, AdaptiveDraftLength)
    assert policy.prior == calibrate.pair_agreement(target, draft)
    assert policy.alpha[0] == policy.prior


def test_a_small_context_measures_on_what_fits(temporary_localspec_home: Path) -> None:
    target, draft = load("reference:seed=3", n_ctx=64), load("reference:seed=3,noise=0.3", n_ctx=64)
    assert 0.0 <= calibrate.pair_agreement(target, draft) <= 1.0
    assert isinstance(Runtime(target, draft, strategy="draft").policy, AdaptiveDraftLength)
