"""The first token waits for no calibration: a runtime starts from a prior cost curve (or
what earlier sessions learnt), corrects it from the passes decoding makes anyway, and keeps
what it learnt for the next load."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from localspec.api import TextDelta, load, runtime_for
from localspec.backends.reference import ReferenceBackend
from localspec.backends.reference import load as load_reference
from localspec.control import calibrate
from localspec.control.config import DEFAULT
from localspec.control.costs import CostCurve
from localspec.control.hardware import cpu_probe
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.protocol import Logits, LogitsMode
from localspec.store import CALIBRATION

# What a 2-core AVX2 host measured for F16 SmolLM2-135M (ms, k = 1..16): the truth the
# learning curves below are fed.
TRUE_MS = [14.9, 22.6, 22.8, 25.7, 27.2, 29.7, 31.6, 33.5, 35.9, 38.3, 40.7, 43.1, 45.7, 48.2, 51.8, 55.5]


def true_seconds(k: int) -> float:
    return TRUE_MS[k - 1] / 1e3


class CountingReference(ReferenceBackend):
    """The reference model, counting its passes."""

    passes = 0

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        self.passes += 1
        return super().eval_block(tokens, logits)


def counting_target() -> CountingReference:
    backend = load_reference("reference:seed=3")
    backend.__class__ = CountingReference
    return backend  # type: ignore[return-value]


def test_a_never_seen_model_starts_from_a_prior_without_timing_a_pass(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("calibrated before the first token"))
    target = counting_target()
    policy = runtime_for(target, strategy="ngram").policy
    assert isinstance(policy, AdaptiveDraftLength) and policy.costs.learning
    assert target.passes == 0


@pytest.mark.parametrize(("bandwidth", "passes"), [(30.0, 1), (15.8, 2)])
def test_the_first_request_decodes_with_no_pass_but_the_prompts_and_the_steps(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch, bandwidth: float, passes: int
) -> None:
    # The prior comes from this machine's measured bandwidth, so it is pinned: the AVX-512
    # hosts' 30 GB/s and the AVX2 hosts' 15.8 (measured), whatever host runs the test.
    probe = replace(cpu_probe(), bandwidth_gbs=bandwidth, gflops=150.0)
    monkeypatch.setattr(calibrate, "cpu_probe", lambda: probe)
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("calibrated before the first token"))
    target = counting_target()
    runtime = runtime_for(target, strategy="ngram")
    events = runtime.stream("one two three one two three one two", max_tokens=12, temperature=0.0)
    first = next(e for e in events if isinstance(e, TextDelta))
    # The prompt's prefill with its last token in it. At 30 GB/s the prior's step is so short
    # that the lookup's time makes the prompt's guess not pay: the first token comes from that
    # pass. At 15.8 the step is twice as long and the guess is drafted: its pass gives the
    # first token. Either way no pass was run to time anything.
    assert first.tokens and target.passes == passes
    assert (first.step.drafted > 0) == (passes == 2)
    finished = list(events)[-1]
    # The prompt's pass counts as a step where its row gave the first token.
    assert target.passes == finished.stats.verify_steps + (passes - 1)  # type: ignore[union-attr]


def test_load_of_a_never_seen_model_measures_nothing(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("calibrated before the first token"))
    with load("reference:seed=5", backend="reference", strategy="ngram") as rt:
        assert rt.generate("a b a b a b", max_tokens=8, temperature=0.0).stats.generated_tokens == 8


def test_the_prior_is_the_roofline_with_dearer_blocks_and_deeper_contexts(temporary_localspec_home: Path) -> None:
    target = load_reference("reference:seed=3")
    prior = calibrate.prior_calibration(target)
    assert prior.source == "prior" and len(prior.verify_seconds) == 16
    assert all(b > a for a, b in zip(prior.verify_seconds, prior.verify_seconds[1:], strict=False))
    assert prior.deep_verify_seconds is not None
    assert all(d > s for d, s in zip(prior.deep_verify_seconds, prior.verify_seconds, strict=True))


def test_a_prior_that_starts_wrong_converges_to_the_machines_curve() -> None:
    # A prior twice too cheap for one token and flat beyond (an accelerator-like roofline)
    # where the machine's blocks cost up to 3.7 times a step.
    curve = CostCurve([0.0075] * 16, learning=True)
    policy = AdaptiveDraftLength(curve, 0.0, max_gamma=15)
    for step in range(300):
        k = (1, 1, 1, 5, 1, 9, 1, 3)[step % 8] if step % 3 else 1
        policy.observe_shadow(0, 0)
        curve.update(k, true_seconds(k))
    for k in (1, 3, 5, 9):
        assert curve.verify(k) == pytest.approx(true_seconds(k), rel=0.05)
    for k in (2, 4, 7, 16):  # never timed: the nearest timed sizes' corrections carry over
        assert curve.verify(k) == pytest.approx(true_seconds(k), rel=0.25)
    truth = AdaptiveDraftLength(CostCurve([t / 1e3 for t in TRUE_MS]), 0.0, max_gamma=15)
    for support in (2, 4, 8, 20):
        assert abs(policy.choose(15, support) - truth.choose(15, support)) <= 1


def test_a_measured_curve_learns_drift_but_not_shape() -> None:
    curve = CostCurve([t / 1e3 for t in TRUE_MS])
    for _ in range(100):
        curve.update(1, true_seconds(1) * 1.2)
    assert curve.verify(1) == pytest.approx(true_seconds(1) * 1.2, rel=0.02)
    assert curve.verify(8) / curve.verify(1) == pytest.approx(TRUE_MS[7] / TRUE_MS[0])


def test_what_a_session_learnt_is_where_the_next_load_starts(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("calibrated before the first token"))
    target = load_reference("reference:seed=3")
    runtime = runtime_for(target, strategy="ngram")
    runtime.generate("x y z x y z x y z", max_tokens=40, temperature=0.0)
    learnt = calibrate.starting_calibration(target)
    assert learnt.source == "learnt" and learnt.evidence and sum(learnt.evidence) >= DEFAULT.learnt_evidence
    again = runtime_for(target, strategy="ngram").policy
    assert isinstance(again, AdaptiveDraftLength) and again.costs.learning
    assert again.costs.verify_seconds == learnt.verify_seconds


def test_a_learnt_curve_is_written_now_and_then_and_at_close_not_after_every_request(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = load_reference("reference:seed=3")
    runtime = runtime_for(target, strategy="ngram")
    now = [100.0]
    runtime._learnt = calibrate.LearntCurve(target, runtime._costs, clock=lambda: now[0])
    writes: list[str] = []
    real_put = CALIBRATION.put
    monkeypatch.setattr(CALIBRATION, "put", lambda key, value: (writes.append(key), real_put(key, value)))
    for _ in range(5):
        runtime.generate("x y z x y z x y z", max_tokens=40, temperature=0.0)
        now[0] += 1.0
    assert len(writes) == 1  # the first request that learnt enough, then none for a while
    now[0] += calibrate.LEARNT_SAVE_SECONDS
    runtime.generate("x y z x y z x y z", max_tokens=40, temperature=0.0)
    assert len(writes) == 2
    runtime.generate("x y z x y z x y z", max_tokens=40, temperature=0.0)
    runtime.close()
    assert len(writes) == 3  # what the last request learnt is not lost
    assert calibrate.starting_calibration(target).source == "learnt"


def test_a_changed_machine_is_followed_and_stored(temporary_localspec_home: Path) -> None:
    # What a machine ten times faster learnt: this one's passes correct it within the session
    # and the next load starts from the corrected curve.
    target = load_reference("reference:seed=3")
    fast = calibrate.Calibration([1e-7] * 16, 1e-7, None, source="learnt", evidence=[32.0] + [0.0] * 15)
    CALIBRATION.put(f"learnt|{calibrate.backend_key(target)}", fast.to_json())
    runtime = runtime_for(target, strategy="ngram")
    runtime.generate("x y z x y z x y z", max_tokens=60, temperature=0.0)
    stored = calibrate.starting_calibration(target)
    assert stored.source == "learnt" and stored.verify_seconds[0] > 5e-7


def test_a_measured_curve_the_machine_left_gives_way_to_learning_not_to_a_measurement(
    temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = load_reference("reference:seed=3")
    calibrate.calibrated(target)
    calibrate.note_drift(CostCurve([0.01], scale=3.0, observed=100, ratio_sum=300.0), [target])
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("measured before the first token"))
    assert calibrate.starting_calibration(target).source == "prior"


def test_a_learnt_curve_survives_the_cache_file(temporary_localspec_home: Path) -> None:
    cal = calibrate.Calibration([0.01, 0.02], 0.01, None, source="learnt", evidence=[3.0, 1.0])
    back = calibrate.Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    assert back == cal and back.cost_curve().learning
    assert not calibrate.Calibration([0.01], 0.01).cost_curve().learning


def test_a_slow_step_before_the_first_token_says_what_it_is_doing() -> None:
    import threading

    from localspec.common.progress import announced

    said: list[str] = []
    spoke = threading.Event()

    def announce(what: str) -> None:
        said.append(what)
        spoke.set()

    with announced("loading big.gguf", announce, after=0.01):
        assert spoke.wait(10)
    with announced("loading small.gguf", announce, after=60):
        pass
    assert said == ["loading big.gguf"]


@pytest.mark.model
def test_the_first_run_of_a_never_seen_gguf_times_no_calibration_pass(
    smollm2_q4_1: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.backends.llamacpp import backend as llamacpp
    from localspec.cli.main import main

    passes: list[int] = []
    real = llamacpp.LlamaCppBackend.eval_block

    def counted(self: llamacpp.LlamaCppBackend, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        passes.append(len(tokens))
        return real(self, tokens, logits)

    monkeypatch.setattr(llamacpp.LlamaCppBackend, "eval_block", counted)
    monkeypatch.setattr(calibrate, "measure", lambda *args: pytest.fail("calibrated before the first token"))
    assert main(["run", "Say hi", "-m", str(smollm2_q4_1), "-t", "0", "-n", "16", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    # The prompt with its last token (n-gram declines a first guess backed by the prompt
    # alone), then one pass per step but the first, which took the prompt pass's row.
    assert len(passes) == stats["verify_steps"] and passes[1:] == [1] * (len(passes) - 1)


def test_a_learnt_curve_prices_its_seldom_timed_sizes_from_the_sizes_it_timed() -> None:
    # What today's 2-core host stored for the Q4_1 SmolLM2 (ms, k = 1..16): sizes 1, 2 and 9
    # timed 32, 13 and 32 times, the rest a few times or never, and past 12 tokens the last
    # local slope carried on at 13 ms a token, more than a whole single-token step.
    stored = [10.08, 24.62, 29.26, 38.83, 40.35, 49.91, 53.71, 55.30]
    stored += [52.34, 63.92, 73.90, 87.20, 101.1, 114.0, 127.1, 140.4]
    evidence = [32.0, 13.0, 4.0, 1.0, 7.0, 0.0, 4.0, 1.0, 32.0, 1.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    curve = CostCurve([t / 1e3 for t in stored], learning=True, evidence=evidence)
    slope = (stored[8] - stored[1]) / 7
    for k in (1, 2, 9):
        assert curve.verify(k) == pytest.approx(stored[k - 1] / 1e3)
    for k in (3, 5, 8):  # between timed sizes: on their line
        assert curve.verify(k) == pytest.approx((stored[1] + slope * (k - 2)) / 1e3)
    assert curve.verify(16) == pytest.approx((stored[8] + slope * 7) / 1e3)  # 80 ms, not 140
    untimed = CostCurve([t / 1e3 for t in stored], learning=True, evidence=[32.0] + [0.0] * 15)
    assert untimed.verify_seconds == [t / 1e3 for t in stored]  # fewer than two timed blocks: as stored


def test_a_learnt_curve_follows_the_level_of_this_session_with_the_shape_it_stored() -> None:
    # Learnt in a busier hour (every pass 1.6 times today's): the single steps of this session
    # set the level, and blocks no pass has timed since load follow it, keeping their shape.
    busy = CostCurve([1.6 * t / 1e3 for t in TRUE_MS], learning=True, evidence=[32.0] * 16)
    for _ in range(20):
        busy.update(1, true_seconds(1))
    for k in (2, 5, 9, 16):
        assert busy.verify(k) / busy.verify(1) == pytest.approx(TRUE_MS[k - 1] / TRUE_MS[0], rel=0.02)


def test_a_learnt_curve_never_falls_past_the_last_size_it_timed() -> None:
    # Shaped on what a load on Mesa's software Vulkan device learnt (s, k = 1..16): its first
    # passes of a size compiled the device's kernels, so the size timed first read dearer than
    # one timed later, and the line from the first timed block to the last fell. Carried on
    # past the last, it priced long blocks below short ones, and a later load past zero.
    stored = [0.2004, 1.559, 1.929, 2.277, 2.496, 2.586, 2.547, 2.379]
    stored += [2.082, 1.656, 1.101, 0.3227, 0.2, 0.2, 0.2, 0.2]
    evidence = [40.0, 3.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    curve = CostCurve(stored, learning=True, evidence=evidence)
    assert all(curve.verify(k) >= curve.verify(11) for k in range(12, 17))  # flat past it, not falling
    assert min(curve.verify(k) for k in range(1, 17)) > 0


def test_a_stored_curve_whose_short_blocks_took_a_long_blocks_price_drafts_a_proven_copy() -> None:
    # As an older localspec stored it on a 2-core EPYC (2026-12-03): a 16-token pass far under
    # its price priced every block at it, 97 ms, 8.6 single steps, and no block was drafted, so
    # timed, again; every later load drafted nothing under support 16.
    stored = [11.3e-3] + [97.3e-3] * 15
    evidence = [32.0] + [0.0] * 14 + [9.0]
    curve = CostCurve(list(stored), learning=True, evidence=evidence)
    for k in range(2, 16):  # no dearer than the line from the single step to the timed block
        assert curve.verify(k) == pytest.approx(11.3e-3 + (k - 1) / 15 * 86.0e-3)
    assert curve.verify(16) == pytest.approx(97.3e-3)
    policy = AdaptiveDraftLength(curve, 2e-5, max_gamma=15)
    assert all(policy.choose(16, support=s) > 0 for s in (5, 8, 10))


def test_a_stored_curve_with_a_price_at_or_below_zero_is_not_started_from(temporary_localspec_home: Path) -> None:
    # An older localspec stored such a curve; every load that started from it stopped with a
    # ValueError. It is now left alone, as a damaged entry is: the load starts from the prior.
    target = load_reference("reference:seed=3")
    fallen = [0.2, 1.56, 1.93, 2.28, 0.32, -0.37, -1.15] + [-2.0] * 9
    stored = calibrate.Calibration(fallen, 0.2, None, source="learnt", evidence=[40.0, 3.0] + [0.0] * 14)
    CALIBRATION.put(f"learnt|{calibrate.backend_key(target)}", stored.to_json())
    assert calibrate.starting_calibration(target).source == "prior"
    assert runtime_for(target, strategy="ngram").generate("x y z x y z", max_tokens=8, temperature=0.0).text
