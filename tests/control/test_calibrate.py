"""The pair agreement that seeds a model drafter's acceptance estimates: measured once per
pair and machine, and where the controller starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.api import runtime_for
from localspec.backends.reference import load
from localspec.control import calibrate
from localspec.control.config import DEFAULT
from localspec.control.policy import AdaptiveDraftLength
from localspec.drafters.ngram import NgramDrafter
from localspec.store import CALIBRATION


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
    policy = runtime_for(target, draft, strategy="draft").policy
    assert isinstance(policy, AdaptiveDraftLength)
    assert policy.prior == calibrate.pair_agreement(target, draft)
    assert policy.alpha[0] == policy.prior


def test_an_adaptive_draft_model_drafts_beside_ngram_lookup(temporary_localspec_home: Path) -> None:
    target, draft = load("reference:seed=3"), load("reference:seed=3,noise=0.3")
    assert isinstance(runtime_for(target, draft, strategy="draft").engine.lookup, NgramDrafter)
    # A fixed draft length drafts with the model it was given, and n-gram alone needs no pair.
    assert runtime_for(target, draft, strategy="draft", draft_tokens=3).engine.lookup is None
    assert runtime_for(target, None, strategy="ngram").engine.lookup is None


def test_a_small_context_measures_on_what_fits(temporary_localspec_home: Path) -> None:
    target, draft = load("reference:seed=3", n_ctx=64), load("reference:seed=3,noise=0.3", n_ctx=64)
    assert 0.0 <= calibrate.pair_agreement(target, draft) <= 1.0
    assert isinstance(runtime_for(target, draft, strategy="draft").policy, AdaptiveDraftLength)


def test_the_cost_curve_is_measured_behind_a_short_and_a_long_text(temporary_localspec_home: Path) -> None:
    target = load("reference:seed=3")
    cal = calibrate.calibrated(target)
    assert cal.deep_verify_seconds is not None and len(cal.deep_verify_seconds) == len(cal.verify_seconds) == 16
    assert all(d >= s for d, s in zip(cal.deep_verify_seconds, cal.verify_seconds, strict=True))
    assert cal.deep_depth == calibrate.DEEP_DEPTH and target.n_past == 0
    curve = cal.cost_curve()
    assert curve.verify(1, calibrate.DEEP_DEPTH) == cal.deep_verify_seconds[0]


def test_a_cached_curve_without_the_long_text_is_measured_again(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = load("reference:seed=3")
    CALIBRATION.put(calibrate.backend_key(target), {"verify_seconds": [0.01] * 16, "decode_seconds": 0.01})
    assert calibrate.calibrated(target).deep_verify_seconds is not None  # an entry from an older localspec
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("measured again"))
    assert calibrate.calibrated(target).deep_verify_seconds is not None  # now it is cached


def test_a_cached_curve_timed_before_rebuilds_were_measured_is_measured_again(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = load("reference:seed=3")
    entry = calibrate.calibrated(target).to_json()
    assert isinstance(entry.pop("rebuild_seconds"), list)
    # As an older localspec stored it: each size timed after a pass of another, rebuild included.
    CALIBRATION.put(calibrate.backend_key(target), entry)
    measured: list[object] = []
    real_measure = calibrate.measure
    monkeypatch.setattr(calibrate, "measure", lambda *args: measured.append(args) or real_measure(*args))
    cal = calibrate.calibrated(target)
    assert len(measured) == 1
    # The numpy backend has no graph to rebuild: at most timer noise, never a negative price.
    assert cal.rebuild_block_seconds >= 0 and cal.rebuild_one_seconds >= 0
    calibrate.calibrated(target)
    assert len(measured) == 1


def test_a_small_context_keeps_one_curve(temporary_localspec_home: Path) -> None:
    cal = calibrate.calibrated(load("reference:seed=3", n_ctx=64))
    assert cal.deep_verify_seconds is None and cal.cost_curve().verify(1, 60) == cal.verify_seconds[0]


def test_a_draft_model_is_timed_as_the_engine_drives_it_once(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = load("reference:seed=3,noise=0.3")
    seconds = calibrate.drafting_seconds(draft)
    assert seconds > 0 and draft.n_past == 0
    monkeypatch.setattr(calibrate.ModelDrafter, "propose", lambda *args: pytest.fail("measured again"))
    assert calibrate.drafting_seconds(draft) == seconds


def test_a_model_drafter_is_costed_at_its_measured_drafting_speed(temporary_localspec_home: Path) -> None:
    target, draft = load("reference:seed=3"), load("reference:seed=3,noise=0.3")
    calibrate.drafting_seconds(draft)
    policy = runtime_for(target, draft, strategy="draft").policy
    assert isinstance(policy, AdaptiveDraftLength)
    assert policy.draft_seconds_per_token == calibrate.drafting_seconds(draft)


def test_an_untimed_draft_model_is_costed_from_its_curve_without_timing_it(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, draft = load("reference:seed=3"), load("reference:seed=3,noise=0.3")
    monkeypatch.setattr(calibrate.ModelDrafter, "propose", lambda *args: pytest.fail("timed before the first token"))
    policy = runtime_for(target, draft, strategy="draft").policy
    assert isinstance(policy, AdaptiveDraftLength)
    expected = calibrate.starting_calibration(draft).verify_seconds[0] * DEFAULT.drafting_overhead
    assert policy.draft_seconds_per_token == expected


def _cache_entry(backend: object) -> dict[str, object]:
    entry = CALIBRATION.get(calibrate.backend_key(backend))  # type: ignore[arg-type]
    assert entry is not None
    return entry


def test_a_curve_far_from_the_machine_is_measured_again_at_the_next_load(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache from a machine ten times faster (or a neighbour that has since left): the running
    # controller learns the drift, and the next load measures afresh instead of trusting it.
    target = load("reference:seed=3")
    cal = calibrate.calibrated(target)
    assert cal.deep_verify_seconds is not None
    key = calibrate.backend_key(target)
    fast = {**cal.to_json(), "verify_seconds": [t / 10 for t in cal.verify_seconds]}
    fast["deep_verify_seconds"] = [t / 10 for t in cal.deep_verify_seconds]
    CALIBRATION.put(key, fast)

    runtime = runtime_for(target, strategy="ngram")
    runtime.generate("Count: one two three", max_tokens=20, temperature=0.0)
    assert not _cache_entry(target).get("stale")  # too few passes to judge by
    runtime.generate("Count: one two three", max_tokens=120, temperature=0.0)
    assert _cache_entry(target).get("stale") is True

    measured: list[object] = []
    real_measure = calibrate.measure
    monkeypatch.setattr(calibrate, "measure", lambda *args: measured.append(args) or real_measure(*args))
    fresh = calibrate.calibrated(target)
    assert len(measured) == 1 and fresh.verify_seconds[0] > fast["verify_seconds"][0]  # type: ignore[index]
    assert not _cache_entry(target).get("stale")
    calibrate.calibrated(target)
    assert len(measured) == 1  # measured once, then cached again


def test_drift_within_the_band_or_on_little_evidence_keeps_the_cache(temporary_localspec_home: Path) -> None:
    target = load("reference:seed=3")
    calibrate.calibrated(target)
    # A burst of load lifts the scale (an EMA over ~20 passes) but not the mean since load.
    steady = calibrate.CostCurve([0.01] * 4, scale=1.6, observed=500, ratio_sum=500 * 1.15)
    n = DEFAULT.drift_evidence - 1
    brief = calibrate.CostCurve([0.01] * 4, scale=2.0, observed=n, ratio_sum=2.0 * n)
    assert not calibrate.note_drift(steady, [target]) and not calibrate.note_drift(brief, [target])
    assert not _cache_entry(target).get("stale")
    n = DEFAULT.drift_evidence
    faster = calibrate.CostCurve([0.01] * 4, scale=0.7, observed=n, ratio_sum=0.7 * n)
    assert calibrate.note_drift(faster, [target]) and _cache_entry(target).get("stale") is True


def test_a_stale_drafting_speed_is_measured_again(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = load("reference:seed=3,noise=0.3")
    first = calibrate.drafting_seconds(draft)
    calibrate.calibrated(draft)
    assert calibrate.note_drift(calibrate.CostCurve([0.01], scale=3.0, observed=100, ratio_sum=300.0), [draft])
    calls: list[int] = []
    real = calibrate.ModelDrafter.propose
    monkeypatch.setattr(calibrate.ModelDrafter, "propose", lambda *a: calls.append(1) or real(*a))
    assert calibrate.drafting_seconds(draft) > 0 and calls
    assert first > 0


def test_a_curve_measured_on_a_host_with_other_simd_is_not_reused(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cloud VM keeps its CPU name on a host of another generation; its SIMD flags tell.
    from localspec.control import hardware

    target = load("reference:seed=3")
    calibrate.calibrated(target)
    before = calibrate.backend_key(target)
    hardware.machine_key.cache_clear()
    monkeypatch.setattr(hardware, "_cpu_name_and_flags", lambda: ("AMD EPYC", ("avx2", "avx512f")))
    try:
        assert calibrate.backend_key(target) != before
        assert CALIBRATION.get(calibrate.backend_key(target)) is None  # measured afresh here
    finally:
        hardware.machine_key.cache_clear()


def test_refresh_measures_the_curve_again_and_caches_the_new_one(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = load("reference:seed=3")
    calibrate.calibrated(target)
    measured: list[object] = []
    real_measure = calibrate.measure
    monkeypatch.setattr(calibrate, "measure", lambda *args: measured.append(args) or real_measure(*args))
    calibrate.calibrated(target)
    assert not measured  # cached
    fresh = calibrate.calibrated(target, refresh=True)
    assert len(measured) == 1
    assert _cache_entry(target) == fresh.to_json()


def test_a_curve_measured_with_another_build_of_the_backend_is_not_reused(temporary_localspec_home: Path) -> None:
    # An upgraded or rebuilt library (llama.cpp with other kernels, another torch) keeps the
    # model file and the machine: only its build tells the curves apart.
    from dataclasses import replace

    target = load("reference:seed=3")
    target.capabilities = replace(target.capabilities, extra={**target.capabilities.extra, "build": "1.0"})
    calibrate.calibrated(target)
    assert CALIBRATION.get(calibrate.backend_key(target)) is not None
    target.capabilities = replace(target.capabilities, extra={**target.capabilities.extra, "build": "1.1"})
    assert CALIBRATION.get(calibrate.backend_key(target)) is None


def test_a_disturbed_size_takes_the_larger_sizes_figure_instead_of_lifting_them() -> None:
    # Sizes 1, 2, 3, 4, 5, 6, 8 (ms): a burst of load during the 4-token passes.
    timed = [12.5, 21.2, 24.1, 35.0, 27.0, 30.0, 39.7]
    assert calibrate.nondecreasing(timed) == [12.5, 21.2, 24.1, 27.0, 27.0, 30.0, 39.7]
    assert calibrate.nondecreasing([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert calibrate.nondecreasing([]) == []


def test_the_calibration_times_a_block_of_9_where_llama_cpps_vulkan_kernels_switch() -> None:
    # Blocks of up to 8 rows take matrix-vector kernels on Vulkan, 9+ matrix-matrix ones: a
    # cliff at 9 that interpolating 8 and 10 would halve (benchmarks/pages/gpu.md).
    target = load("reference:seed=3")
    sizes: list[int] = []
    evaluate = target.eval_block

    def spy(tokens, logits="all"):  # type: ignore[no-untyped-def]
        sizes.append(len(tokens))
        return evaluate(tokens, logits)

    target.eval_block = spy  # type: ignore[method-assign]
    calibrate.measure(target, max_k=12, repeats=1)
    assert {8, 9, 10} <= set(sizes) and 7 not in sizes
