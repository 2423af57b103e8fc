"""The adaptive draft length on synthetic cost curves and acceptance streams."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from localspec.backends.reference import BOS, ReferenceBackend
from localspec.control.config import DEFAULT
from localspec.control.costs import CostCurve
from localspec.control.policy import AdaptiveDraftLength, FixedDraftLength, choose_static, support_level
from localspec.core.engine import Engine, Shadow
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats, Step
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter

# Measured shapes (ms) on a 2-core AVX2 CPU, SmolLM2-135M (benchmarks/verify_costs.py).
Q4_1 = [6.2e-3, 12.4e-3, 16.7e-3, 21.0e-3, 25.1e-3, 29.2e-3, 33.3e-3, 37.4e-3, 41.9e-3]
NEARLY_FREE = [10e-3 + 0.2e-3 * k for k in range(16)]


def test_plain_decoding_is_chosen_when_verifying_costs_as_much_as_decoding_each_token() -> None:
    linear = [6e-3 * k for k in range(1, 13)]
    assert choose_static(linear, alpha=0.9, draft_cost=0.0, max_gamma=12) == 0


def test_plain_decoding_is_chosen_when_acceptance_is_low_on_compute_bound_hardware() -> None:
    assert choose_static(Q4_1, alpha=0.5, draft_cost=0.0, max_gamma=8) == 0


def test_long_drafts_when_verification_is_nearly_free_and_acceptance_is_high() -> None:
    assert choose_static(NEARLY_FREE, alpha=0.95, draft_cost=0.0, max_gamma=12) >= 10


def test_an_expensive_drafter_shortens_the_draft() -> None:
    cheap = choose_static(NEARLY_FREE, alpha=0.8, draft_cost=0.0, max_gamma=12)
    costly = choose_static(NEARLY_FREE, alpha=0.8, draft_cost=5e-3, max_gamma=12)
    assert costly < cheap


def test_the_policy_learns_to_stop_drafting_when_drafts_are_rejected() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(Q4_1)), 0.0, max_gamma=8, prior=0.9)
    assert policy.choose(8) > 0
    chosen = []
    for _ in range(40):
        g = policy.choose(8)
        chosen.append(g)
        policy.observe(Step(g, 0, 0.0, Q4_1[g]))
    assert chosen[-20:] == [0] * 20


def test_with_nearly_free_verification_rejected_drafts_shrink_to_cheap_probes() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0, max_gamma=8)
    chosen = []
    for _ in range(40):
        g = policy.choose(8)
        chosen.append(g)
        policy.observe(Step(g, 0, 0.0, NEARLY_FREE[g]))
    assert chosen[0] >= 4
    assert max(chosen[-10:]) <= 1


def test_the_policy_lengthens_drafts_when_everything_is_accepted() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(Q4_1)), 0.0, max_gamma=8, prior=0.5)
    assert policy.choose(8) == 0
    for _ in range(40):
        policy.observe_shadow(8, 8)  # a free drafter's guesses keep coming true
    assert policy.choose(8) >= 6


def test_the_policy_recovers_from_a_rejected_stretch_when_text_becomes_predictable() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0, max_gamma=8)
    for _ in range(20):
        policy.observe(Step(4, 0, 0.0, NEARLY_FREE[4]))
    low = policy.choose(8)
    for _ in range(20):
        g = max(policy.choose(8), 1)
        policy.observe(Step(g, g, 0.0, NEARLY_FREE[g]))
    assert policy.choose(8) > low


def test_expected_tokens_follows_the_per_position_product() -> None:
    policy = AdaptiveDraftLength(CostCurve([1.0, 1.0]), 0.0, max_gamma=3, alpha=[0.5, 0.5, 1.0])
    assert policy.expected_tokens(0) == 1.0
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.25)


def test_the_choice_respects_the_limit() -> None:
    assert AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0, prior=0.99).choose(2) <= 2
    assert FixedDraftLength(6).choose(3) == 3


def test_cost_curve_extends_beyond_measurements_and_tracks_drift() -> None:
    curve = CostCurve([1.0, 2.0, 3.0])
    assert curve.verify(5) == pytest.approx(5.0)
    curve.update(2, 10.0)
    assert 2.0 < curve.verify(2) < 2.0 * (1 + 2.0 * 0.05) + 1e-9  # one outlier is clipped and damped


def test_drift_seen_on_single_token_steps_moves_the_whole_curve() -> None:
    # A longer text makes every pass slower; a controller that sees only single-token steps
    # (it drafts nothing) must not come to think that longer passes got relatively cheaper.
    curve = CostCurve([10.0, 16.0, 18.0, 20.0])
    for _ in range(200):
        curve.update(1, 14.0)
    assert curve.verify(1) == pytest.approx(14.0, rel=0.01)
    assert curve.verify(2) / curve.verify(1) == pytest.approx(1.6)
    policy = AdaptiveDraftLength(CostCurve([10.0, 16.0, 18.0, 20.0]), 0.0, prior=0.3)
    assert policy.choose(3) == 0
    for _ in range(200):
        policy.observe(Step(0, 0, 0.0, 14.0))
    assert policy.choose(3) == 0


def test_random_acceptance_stream_converges_near_its_true_rate() -> None:
    rng = np.random.default_rng(0)
    policy = AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0, max_gamma=4)
    symmetric = replace(DEFAULT, weight_hit=0.05, weight_miss=0.05)
    even = AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0, config=symmetric)
    cautious = AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0)
    for _ in range(2000):
        accepted = 0
        while accepted < 4 and rng.random() < 0.7:
            accepted += 1
        policy.observe(Step(4, accepted, 0.0, NEARLY_FREE[4]))  # a model drafter's drafts
        hit = int(rng.random() < 0.7)
        even.observe_shadow(1, hit, support=8)  # a free drafter's guesses of support 8
        cautious.observe_shadow(1, hit, support=8)
    # A model drafter's estimates count hits and trials: they settle on the true rate.
    assert policy.alpha[0] == pytest.approx(0.7, abs=0.08)
    assert policy.alpha[3] == pytest.approx(0.7, abs=0.1)
    level = support_level(8) - 1
    assert even.by_support[level] == pytest.approx(0.7, abs=0.1)
    # A free drafter's support levels weigh rejections more: below the true rate, on the safe side.
    assert 0.4 < cautious.by_support[level] < even.by_support[level]


# A CPU where a draft model's token costs half a target step and a pass over 2-6 tokens
# little more than one (the torch backend on this machine, an int8 copy of an f32 target).
FLAT = [22.5e-3, 24.7e-3, 27.8e-3, 33.6e-3, 36.6e-3, 36.6e-3, 39.9e-3, 43.2e-3]


def test_a_short_cluster_of_misses_does_not_stop_a_drafter_that_agreed_all_along() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(FLAT)), 11e-3, max_gamma=6, prior=0.95, prior_weight=20, margin=0.1)
    for _ in range(20):
        g = policy.choose(6)
        assert g > 0
        policy.observe(Step(g, g, g * 11e-3, FLAT[g]))
    policy.observe(Step(5, 0, 55e-3, FLAT[5]))  # where the text turns
    policy.observe(Step(5, 1, 55e-3, FLAT[5]))
    assert policy.choose(6) > 0
    assert policy.alpha[0] > 0.85


def test_a_drafter_that_keeps_missing_stops_despite_a_high_prior() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(FLAT)), 11e-3, max_gamma=6, prior=0.95, prior_weight=20, margin=0.1)
    chosen = []
    for _ in range(40):
        g = policy.choose(6)
        chosen.append(g)
        policy.observe(Step(g, 0, g * 11e-3, FLAT[g]))
    assert chosen[0] > 0
    assert chosen[-20:] == [0] * 20


def hybrid() -> AdaptiveDraftLength:
    """An int8 self-drafter (11 ms a token, 95 % agreement) beside a free n-gram lookup."""
    return AdaptiveDraftLength(
        CostCurve(list(FLAT)),
        11e-3,
        max_gamma=8,
        prior=0.95,
        prior_weight=20,
        margin=0.1,
        lookup_seconds_per_token=2e-5,
    )


def test_a_long_copy_goes_to_the_lookup_and_new_text_to_the_model() -> None:
    policy = hybrid()
    gamma, from_lookup = policy.choose_source(16, support=32, limit=15)
    assert from_lookup and gamma >= 6  # a 32-token match: free and nearly sure
    gamma, from_lookup = policy.choose_source(16, support=1, limit=15)
    assert not from_lookup and gamma > 0  # a 1-token match is right 15 % of the time
    assert policy.choose_source(0, support=0, limit=15) == (policy.choose(15), False)


def test_a_long_catch_up_keeps_the_model_out_while_the_lookup_has_a_guess() -> None:
    policy = hybrid()
    policy.catch_up_seconds_per_token = 4e-3
    assert policy.choose_source(4, support=2, limit=15, backlog=1)[1] is False
    lookup_gamma = policy._best(4, 2, 0, 0, 2e-5, 0.0)[0]
    assert lookup_gamma > 0
    assert policy.choose_source(4, support=2, limit=15, backlog=90) == (lookup_gamma, True)


def test_the_lookups_drafts_do_not_teach_the_model_drafters_cost() -> None:
    policy = hybrid()
    policy.observe(Step(10, 10, 2e-4, FLAT[7], support=20, lookup=True))
    assert policy.draft_seconds_per_token == pytest.approx(11e-3)
    assert policy.alpha[0] == pytest.approx(0.95)  # a lookup draft is evidence about the lookup
    policy.observe(Step(2, 2, 2 * 13e-3, FLAT[2]))
    assert policy.draft_seconds_per_token > 11e-3


def test_a_fixed_length_drafts_with_the_model() -> None:
    assert FixedDraftLength(4).choose_source(16, support=32, limit=3) == (3, False)


def test_a_model_drafters_evidence_ages_while_it_sits_out() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(FLAT)), 11e-3, max_gamma=6, prior=0.95, prior_weight=2)
    for _ in range(10):
        policy.observe(Step(1, 0, 11e-3, FLAT[1]))
    low = policy.alpha[0]
    for _ in range(1000):
        policy.observe(Step(0, 0, 0.0, FLAT[0]))  # sitting out: no new evidence
    assert low < 0.2 < 0.6 < policy.alpha[0] < 0.95


def test_a_cost_curve_needs_positive_timings() -> None:
    with pytest.raises(ValueError):
        CostCurve([])
    with pytest.raises(ValueError):
        CostCurve([0.0, 1.0])


# Measured on the F16 SmolLM2-135M target (calibration on this machine).
F16 = [13.3e-3, 18.7e-3, 20.3e-3, 23.8e-3, 25.7e-3, 28.0e-3, 29.6e-3, 32.9e-3, 36.1e-3, 39.7e-3, 42.3e-3, 49e-3]


def test_a_well_supported_guess_gets_a_longer_draft_than_a_weak_one() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    assert policy.choose(12, support=1) == 0  # a 1-token match is right one time in five
    assert policy.choose(12, support=24) >= 6  # a 24-token match is almost surely a copy
    assert policy.choose(12, support=24) > policy.choose(12, support=5)


def test_a_support_level_counts_the_edges_its_support_reaches() -> None:
    edges = DEFAULT.support_edges
    assert list(edges) == sorted(set(edges)), "support_level's search needs ascending edges"
    for support in range(0, edges[-1] + 5):
        assert support_level(support) == sum(1 for edge in edges if support >= edge)
    assert (support_level(0), support_level(1), support_level(5), support_level(100)) == (0, 1, 4, len(edges))


def test_support_levels_learn_separately() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    strong = policy.choose(12, support=24)
    for _ in range(30):
        policy.observe(Step(3, 0, 0.0, F16[3], support=3))  # weak guesses keep failing
    assert policy.choose(12, support=24) == strong
    for _ in range(30):
        policy.observe(Step(8, 0, 0.0, F16[8], support=24))  # now the strong ones fail too
    assert policy.choose(12, support=24) == 0


def test_shadow_evidence_from_position_start_teaches_only_the_unverified_positions() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0, max_gamma=8)
    before = list(policy.by_support)
    # A 16-token guess on a 1-token match, 3 verified, all came true: its tokens 3..7 (the
    # policy's horizon) were backed by 4..8 tokens, i.e. levels 4-6; levels 1-3 were verified.
    policy.observe_shadow(16, 16, support=1, start=3)
    after = list(policy.by_support)
    assert after[:3] == before[:3] and all(a > b for a, b in zip(after[3:6], before[3:6], strict=True))
    assert after[6:] == before[6:]
    policy.observe_shadow(16, 1, support=1, start=3)  # broke inside the verified part: no evidence
    assert policy.by_support == after


class _ShadowLog:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int, int]] = []

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        self.calls.append((drafted, accepted, support, start))


def test_an_unverified_guess_teaches_each_token_as_soon_as_it_is_known() -> None:
    # A copy in progress: its evidence must not wait until all 6 guessed tokens are known.
    log = _ShadowLog()
    shadow = Shadow([7, 8, 9, 10, 11, 12], at=3, support=2, start=0)
    assert not shadow.settle([0, 1, 2, 7, 8], log)  # type: ignore[arg-type]
    assert log.calls == [(2, 2, 2, 0)]  # two hits, nothing else
    assert not shadow.settle([0, 1, 2, 7, 8], log)  # type: ignore[arg-type]
    assert len(log.calls) == 1  # nothing new known: nothing learnt twice
    assert shadow.settle([0, 1, 2, 7, 8, 9, 5], log)  # type: ignore[arg-type]
    assert log.calls[-1] == (6, 3, 2, 2)  # one more hit, then the miss at position 3
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    before = list(policy.by_support)
    Shadow([7, 8, 9], at=3, support=2, start=0).settle([0, 1, 2, 7, 8], policy)
    assert policy.by_support[support_level(2) - 1] > before[support_level(2) - 1]
    assert policy.by_support[support_level(3) - 1] > before[support_level(3) - 1]


def test_a_copy_is_trusted_more_with_every_token_it_has_matched() -> None:
    # The i-th token of a guess on an s-token match stands on s + i tokens of matched text:
    # a guess that starts weakly is backed better and better along its length.
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    chain = policy.chain(10, support=3)
    assert chain == sorted(chain) and chain[0] < chain[-1]
    assert policy.chain(4, support=24) == [policy.by_support[-2]] * 4  # 24..27: one level
    assert policy.chain(3, support=0) == policy.alpha[:3]  # a model drafter: per position


def test_a_miss_teaches_the_level_of_the_token_that_missed() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    before = list(policy.by_support)
    policy.observe(Step(6, 2, 0.0, F16[6], support=3))  # tokens on 3 and 4 right, on 5 wrong
    levels = [a - b for a, b in zip(policy.by_support, before, strict=True)]
    assert levels[2] > 0 and levels[3] != 0 and all(d == pytest.approx(0, abs=1e-3) for d in levels[5:])


# The same target behind 32 and behind 512 tokens: every pass costs more, a single token most.
SHALLOW = [10e-3, 19e-3, 20e-3, 21e-3, 22e-3, 22e-3, 25e-3, 28e-3]
DEEP = [16e-3, 21e-3, 23e-3, 25e-3, 27e-3, 29e-3, 33e-3, 37e-3]


def test_the_cost_curve_follows_the_length_of_the_text() -> None:
    curve = CostCurve(list(SHALLOW), deep_seconds=list(DEEP), depth=32, deep_depth=512)
    assert curve.verify(1, 0) == curve.verify(1, 32) == SHALLOW[0]
    assert curve.verify(1, 272) == pytest.approx((SHALLOW[0] + DEEP[0]) / 2)
    assert curve.verify(4, 512) == DEEP[3]
    assert curve.verify(1, 992) == pytest.approx(2 * DEEP[0] - SHALLOW[0])  # linear beyond
    assert curve.verify(1, 300) < curve.verify(2, 300) < curve.verify(8, 300)


def test_a_draft_that_does_not_pay_on_a_short_text_can_pay_on_a_long_one() -> None:
    # Behind a long context a single-token step costs 60 % more but a 5-token pass only 23 %
    # more: the same guess is worth verifying there. A curve measured on a short text alone
    # (and scaled for drift) would keep declining it.
    curve = CostCurve(list(SHALLOW), deep_seconds=list(DEEP), depth=32, deep_depth=512)
    policy = AdaptiveDraftLength(curve, 0.0, prior=0.5)
    assert policy.choose(8, depth=32) == 0
    assert policy.choose(8, depth=512) > 0
    policy.observe(Step(0, 0, 0.0, DEEP[0], depth=512))  # as predicted: no drift learned
    assert policy.costs.scale == pytest.approx(1.0)


def test_a_deep_curve_must_come_from_a_longer_context() -> None:
    with pytest.raises(ValueError):
        CostCurve(list(SHALLOW), deep_seconds=list(DEEP), depth=512, deep_depth=32)
    with pytest.raises(ValueError):
        CostCurve(list(SHALLOW), deep_seconds=[0.0] * len(SHALLOW))


def test_a_long_catch_up_for_a_draft_model_is_charged_before_drafting() -> None:
    policy = AdaptiveDraftLength(
        CostCurve(list(NEARLY_FREE)), 2e-3, max_gamma=8, prior=0.9, catch_up_seconds_per_token=3e-3
    )
    assert policy.choose(8, backlog=0) > 0
    assert policy.choose(8, backlog=200) == 0  # 0.6 s of catching up is not won back by one draft


def test_catching_up_does_not_count_as_the_cost_of_each_drafted_token() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 2e-3, catch_up_seconds_per_token=3e-3)
    policy.observe(Step(4, 4, 4 * 2e-3 + 50 * 3e-3, NEARLY_FREE[4], backlog=50))
    assert policy.draft_seconds_per_token == pytest.approx(2e-3)


def test_a_margin_on_its_own_time_keeps_a_costly_drafter_off_near_break_even() -> None:
    # Predicted 1.01x: drafting pays on paper, but not once the drafter's 3.8 ms is 10 % dearer.
    steady = AdaptiveDraftLength(CostCurve([10e-3, 12e-3, 14e-3]), 3.8e-3, max_gamma=2, prior=0.6)
    assert steady.rate(1) * 10e-3 == pytest.approx(1.6 / 1.58)
    assert steady.choose(2) > 0
    assert (
        AdaptiveDraftLength(CostCurve([10e-3, 12e-3, 14e-3]), 3.8e-3, max_gamma=2, prior=0.6, margin=0.1).choose(2) == 0
    )


def test_a_cheap_drafter_is_not_held_off_a_small_gain() -> None:
    # The H100's 8B int4 target and 1B drafter (shared/gpu, 2026-11-27): a block of 2 is 1.14
    # steps and a drafted token 0.37 of one, so γ=1 at 60 % acceptance gains 6 %, less than a
    # margin on the whole step would ask, but far more than 10 % of the drafter's own time.
    policy = AdaptiveDraftLength(CostCurve([6.18e-3, 7.05e-3, 7.36e-3]), 2.28e-3, max_gamma=2, prior=0.6, margin=0.1)
    assert policy.rate(1) * 6.18e-3 == pytest.approx(1.06, abs=0.005)
    assert policy.choose(2) == 1


def test_a_drafter_drafting_near_break_even_is_not_stopped_by_the_starting_margin() -> None:
    # Charged 10 % more for its own time it would not start (predicted 0.99x), but drafting
    # already, it keeps on while it beats plain decoding at its price (1.01x).
    policy = AdaptiveDraftLength(CostCurve([10e-3, 12e-3, 14e-3]), 3.8e-3, max_gamma=2, prior=0.6, margin=0.1)
    assert policy.choose(2) == 0
    policy.observe(Step(1, 1, 3.8e-3, 12e-3))  # a step it drafted (a fixed start, or a probe)
    policy.alpha[0] = 0.6
    assert policy.choose(2) == 1


def test_sampled_requests_start_from_their_own_lower_priors() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    greedy = policy.expected_tokens(6, support=3)
    policy.begin(sampled=True)
    assert policy.by_support == list(DEFAULT.sampled_support_priors)
    assert policy.expected_tokens(6, support=3) < greedy
    assert all(s <= g for s, g in zip(DEFAULT.sampled_support_priors, DEFAULT.support_priors, strict=True))


def test_greedy_and_sampled_requests_keep_their_own_evidence() -> None:
    policy = AdaptiveDraftLength(CostCurve(list(F16)), 0.0)
    for _ in range(20):
        policy.observe(Step(6, 0, 0.0, F16[6], support=3))  # greedy guesses keep failing
    greedy_learnt = list(policy.by_support)
    policy.begin(sampled=True)
    assert policy.by_support == list(DEFAULT.sampled_support_priors)  # none of that carried over
    policy.observe(Step(6, 6, 0.0, F16[6], support=3))
    sampled_learnt = list(policy.by_support)
    policy.begin(sampled=False)
    assert policy.by_support == greedy_learnt
    policy.begin(sampled=True)
    assert policy.by_support == sampled_learnt
    policy.begin(sampled=True)  # the same kind again keeps what it learnt
    assert policy.by_support == sampled_learnt


class KindRecorder(FixedDraftLength):
    def __init__(self) -> None:
        super().__init__(2)
        self.kinds: list[bool] = []

    def begin(self, sampled: bool) -> None:
        self.kinds.append(sampled)


def test_the_engine_tells_the_policy_which_kind_of_request_runs() -> None:
    target = ReferenceBackend(vocab_size=12, seed=0)
    engine = Engine(target, NgramDrafter(min_ngram=1), free_drafter=True)
    policy = KindRecorder()
    rng = np.random.default_rng(0)
    for cfg in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8)):
        list(engine.generate([BOS, 3, 4, 3, 4], 6, cfg, policy, Stats(), rng))
    assert policy.kinds == [False, True]


def test_a_draft_model_the_policy_would_not_use_is_spared_its_prefill() -> None:
    prompt = [BOS, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    greedy = SamplingConfig(temperature=0.0)
    texts = []
    for policy, prefilled in ((FixedDraftLength(0), False), (FixedDraftLength(2), True)):
        draft = ReferenceBackend(vocab_size=12, seed=0, noise=0.5)
        engine = Engine(ReferenceBackend(vocab_size=12, seed=0), ModelDrafter(draft))
        steps = list(engine.generate(prompt, 6, greedy, policy, Stats(), np.random.default_rng(0)))
        texts.append([t for step in steps for t in step.tokens])
        assert (draft.n_past > 0) == prefilled
    assert texts[0] == texts[1]  # the drafter's prefill is not part of what the target says
    # The adaptive policy asks its own cost model: a drafter dearer than the target step never pays.
    assert not AdaptiveDraftLength(CostCurve(list(F16)), 1.0, prior=0.9).would_draft(len(prompt))
    assert AdaptiveDraftLength(CostCurve(list(NEARLY_FREE)), 0.0, prior=0.9).would_draft(len(prompt))


def test_a_drafter_started_cold_catches_up_when_a_draft_comes_after_all() -> None:
    prompt = [BOS, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    draft = ReferenceBackend(vocab_size=12, seed=0, noise=0.5)
    drafter = ModelDrafter(draft)
    drafter.start(prompt, warm=False)
    assert drafter.backlog(prompt) == len(prompt) - 1
    guess = drafter.propose(prompt, 3, SamplingConfig(temperature=0.0), np.random.default_rng(0))
    assert len(guess.tokens) >= 1 and list(draft.cached_tokens()[: len(prompt)]) == prompt


# A curve learnt while the machine was busy: passes of 2 tokens and more priced 7-30 times a
# single-token step, each size trusted on 32 passes, where they really cost a little more
# than one step.
BUSY = [7.0e-3, 52e-3, 57e-3, 45e-3, 70e-3, 95e-3, 160e-3, 229e-3] + [229e-3 + 30e-3 * i for i in range(1, 9)]


def quiet(k: int) -> float:
    return 7.0e-3 * (1 + 0.08 * (k - 1))


def busy_curve() -> CostCurve:
    return CostCurve(list(BUSY), learning=True, evidence=[32.0] * len(BUSY))


def test_a_pass_far_under_a_learnt_price_reprices_every_block_size_at_it() -> None:
    curve = busy_curve()
    curve.update(1, quiet(1))
    curve.update(2, quiet(2))  # the first two-token pass in a quiet session
    assert curve.verify(2) == pytest.approx(quiet(2), rel=0.05)
    assert curve.verify(9) == pytest.approx(quiet(2), rel=0.05)  # until a pass of its own
    assert curve.verify(1) == pytest.approx(quiet(1), rel=0.05)
    for _ in range(DEFAULT.learnt_passes):
        curve.update(16, quiet(16))
    assert curve.verify(9) == pytest.approx(quiet(9), rel=0.1)  # between two timed sizes


def test_a_long_pass_far_under_its_price_never_makes_a_short_block_dearer() -> None:
    # Short blocks priced as they cost, long ones learnt in a busier hour (three times dearer):
    # the first quiet 16-token pass re-prices the curve. Every block used to take that pass's
    # price, a 2-token pass 2.2 single steps where it costs 1.08; where a long pass costs 8
    # steps, no proven guess was drafted again, so no block was timed to mend it.
    prices = [quiet(k) for k in range(1, 9)] + [3 * quiet(k) for k in range(9, 17)]
    curve = CostCurve(prices, learning=True, evidence=[32.0] * 16)
    curve.update(16, quiet(16))
    assert curve.verify(16) == pytest.approx(quiet(16), rel=0.05)
    assert all(curve.verify(k) <= quiet(k) * 1.05 for k in range(2, 9))
    assert curve.verify(12) == pytest.approx(quiet(16), rel=0.05)  # a dearer size: the pass's price


def test_a_pass_within_the_noise_of_its_price_keeps_the_learnt_shape() -> None:
    curve = busy_curve()
    curve.update(3, BUSY[2] * 0.8)
    assert curve.verify(8) == pytest.approx(BUSY[7], rel=0.05)


def test_a_proven_copy_source_kept_idle_by_a_stale_curve_is_probed_and_drafts_again() -> None:
    policy = AdaptiveDraftLength(busy_curve(), 2e-5, max_gamma=15)
    gammas = []
    for _ in range(120):
        gamma = policy.choose(16, support=20)
        gammas.append(gamma)
        policy.observe(
            Step(drafted=gamma, accepted=gamma, draft_seconds=0.0, verify_seconds=quiet(gamma + 1), support=20)
        )
    first = next(i for i, g in enumerate(gammas) if g > 0)
    assert first == DEFAULT.probe_after - 1 and gammas[first] >= 8  # after DEFAULT.probe_after passes
    assert min(gammas[first + 1 :]) >= 4  # and long drafts from then on


def test_weak_guesses_are_never_probed() -> None:
    policy = AdaptiveDraftLength(busy_curve(), 2e-5, max_gamma=15)
    assert policy.chain(1, 1)[0] < DEFAULT.probe_alpha
    assert all(policy.choose(16, support=1) == 0 for _ in range(3 * DEFAULT.probe_after))


def test_a_stale_curve_beside_a_draft_model_probes_with_the_lookup() -> None:
    policy = AdaptiveDraftLength(busy_curve(), 5e-3, max_gamma=15, lookup_seconds_per_token=2e-5)
    choices = [policy.choose_source(16, 20, 16) for _ in range(DEFAULT.probe_after)]
    assert choices[-1][1] and choices[-1][0] >= 8 and all(c == (0, False) for c in choices[:-1])


def test_a_proven_copy_kept_short_by_a_dear_slope_is_probed_with_a_longer_draft() -> None:
    # One token 7 ms, two 14 ms (blocks take another kernel), and the same slope carried on
    # beyond: drafts longer than one never look worth it. Really, blocks grow by 0.5 ms a token.
    def truth(k: int) -> float:
        return 7e-3 if k == 1 else 14e-3 + 0.5e-3 * (k - 2)

    curve = CostCurve([7e-3 * k for k in range(1, 17)], learning=True, evidence=[32.0, 32.0] + [0.0] * 14)
    policy = AdaptiveDraftLength(curve, 2e-5, max_gamma=15)
    gammas = []
    for _ in range(80):
        gamma = policy.choose(16, support=20)
        gammas.append(gamma)
        step = Step(drafted=gamma, accepted=gamma, draft_seconds=0.0, verify_seconds=truth(gamma + 1), support=20)
        policy.observe(step)
    assert gammas[: DEFAULT.probe_after - 1] == [0] * (DEFAULT.probe_after - 1)
    assert gammas[DEFAULT.probe_after - 1] >= 8  # the probe: as far as the guess is likely right
    assert min(gammas[DEFAULT.probe_after + 2 :]) >= 8  # the curve, timed further out, drafts long


def test_spikes_of_other_processes_do_not_make_blocks_look_cheap_to_a_learning_curve() -> None:
    # A split target at 0 ms: a step 8 ms, a block of k tokens 8 ms * (2.6 + 0.7 (k - 2)).
    # A third of the passes of any size pay a fixed 6 ms more (other processes on the cores).
    def truth(k: int) -> float:
        return 8e-3 if k == 1 else 8e-3 * (2.6 + 0.7 * (k - 2))

    rng = np.random.default_rng(0)
    curve = CostCurve([4e-3 * (1 + 0.3 * (k - 1)) for k in range(1, 17)], learning=True)  # an optimistic prior
    for n in range(400):
        k = 2 + n % 3 if n % 10 == 0 else 1  # mostly single steps, now and then a short draft
        curve.update(k, truth(k) + (6e-3 if rng.random() < 1 / 3 else 0.0))
    for k in (2, 3, 4):
        assert curve.verify(k) / curve.verify(1) == pytest.approx(truth(k) / truth(1), rel=0.05)


def test_blocks_timed_under_a_load_that_ends_keep_their_quiet_price_in_steps() -> None:
    # Steps 9 ms and blocks 2.5 steps on a quiet machine; for a while another process doubles
    # every pass, and the drafts of that while are timed then. Learnt in seconds, the blocks
    # kept the busy hour's price (5 steps once the steps were quiet again), and the stored
    # curve started every later load so: the same held-out prompts drafted nothing.
    def truth(k: int) -> float:
        return 9e-3 if k == 1 else 9e-3 * (1.8 + 0.35 * (k - 2))

    curve = CostCurve([truth(k) for k in range(1, 17)], learning=True, evidence=[32.0] * 16)
    for level, steps in ((1.0, 200), (2.0, 200), (1.0, 100)):
        for n in range(steps):
            k = 2 + n % 5 if level > 1.0 and n % 5 == 0 else 1
            curve.update(k, level * truth(k))
    stored, _ = curve.learnt()
    for k in (2, 3, 4, 5, 6):
        assert curve.verify(k) / curve.verify(1) == pytest.approx(truth(k) / truth(1), rel=0.02)
        assert stored[k - 1] / stored[0] == pytest.approx(truth(k) / truth(1), rel=0.02)


def test_a_copy_drafted_whole_after_a_busy_request_keeps_the_blocks_shape() -> None:
    # A request on a machine twice as busy, then a quiet one drafted whole in 16-token passes
    # (no single step to measure them against), then plain steps: the busy request's steps
    # must not price the quiet blocks at half, nor the quiet blocks price the steps as busy.
    def truth(k: int) -> float:
        return 9e-3 if k == 1 else 9e-3 * (1.8 + 0.35 * (k - 2))

    curve = CostCurve([truth(k) for k in range(1, 17)], learning=True, evidence=[32.0] * 16)
    for level, sizes in ((2.0, [1, 1, 1, 4, 1, 16] * 50), (1.0, [16] * 200), (1.0, [1] * 30)):
        curve.begin()
        for k in sizes:
            curve.update(k, level * truth(k))
    for k in (4, 16):
        assert curve.verify(k) / curve.verify(1) == pytest.approx(truth(k) / truth(1), rel=0.02)


def test_a_prior_that_never_timed_a_block_waits_for_a_likely_guess_to_time_one() -> None:
    # A roofline prior prices blocks near a single step; a weak guess would pay for the pass.
    prior = CostCurve([4e-3 * (1 + 0.05 * (k - 1)) for k in range(1, 17)], learning=True)
    policy = AdaptiveDraftLength(prior, 2e-5, max_gamma=15)
    assert policy.chain(1, 3)[0] < DEFAULT.first_block_alpha
    assert policy.choose(16, support=3) == 0
    assert policy.choose(16, support=12) > 0  # a likely guess drafts, and its pass times a block
    policy.observe(Step(drafted=2, accepted=2, draft_seconds=0.0, verify_seconds=4.4e-3, support=12))
    assert prior.timed_a_block() and policy.choose(16, support=3) > 0
    measured = AdaptiveDraftLength(CostCurve([4e-3 * (1 + 0.05 * (k - 1)) for k in range(1, 17)]), 2e-5, max_gamma=15)
    assert measured.choose(16, support=3) > 0  # a measured curve has timed its blocks


@pytest.mark.parametrize("curve", [Q4_1, NEARLY_FREE], ids=["cpu", "nearly-free"])
def test_would_guess_answers_what_choose_will_do_and_changes_nothing(curve: list[float]) -> None:
    # The engine asks it before the prefill to decide whether the first token comes from the
    # prompt's pass: the answer must be choose()'s, and asking must not move the probe's count
    # or what explain() says of the last choice.
    for guessed, support in [(0, 0), (1, 1), (4, 1), (8, 3), (8, 9), (16, 20)]:
        asked, chose = (
            AdaptiveDraftLength(CostCurve(list(curve)), 2e-5),
            AdaptiveDraftLength(CostCurve(list(curve)), 2e-5),
        )
        for policy in (asked, chose):
            policy.begin(False)
            policy.choose(6, 12)
        before = (asked.explain(), asked._declined)
        answer = asked.would_guess(guessed, support, depth=40)
        assert (asked.explain(), asked._declined) == before
        assert answer == (guessed > 0 and chose.choose(guessed, support, depth=40) > 0), (guessed, support)
    assert FixedDraftLength(0).would_guess(4, 9) is False and FixedDraftLength(3).would_guess(4, 1) is True
    assert FixedDraftLength(3).would_guess(0, 0) is False


DIPS = [10e-3, 12e-3, 11e-3, 14e-3]
# The Q4_1 host's curves (tests/data/replay_curves.json): what the deep one adds dips at k = 2, so past its
# depth (512) a longer pass may cost less there, and only within it does the choice stop early.
Q4_1_SHALLOW = [6.2e-3, 13.8e-3, 16.3e-3, 18.6e-3, 23.3e-3, 25.5e-3, 26.7e-3, 28.0e-3, 31.4e-3]
Q4_1_DEEP = [7.9e-3, 15.4e-3, 18.7e-3, 22.3e-3, 27.4e-3, 30.8e-3, 32.4e-3, 34.1e-3, 38.4e-3]


@pytest.mark.parametrize("replays_beyond", [None, 0, 4], ids=["dense", "hybrid-copies", "hybrid-snapshots"])
@pytest.mark.parametrize(
    ("curve", "deep"),
    [(Q4_1, None), (NEARLY_FREE, None), (DIPS, None), (Q4_1_SHALLOW, Q4_1_DEEP)],
    ids=["cpu", "nearly-free", "dips", "cpu-deep"],
)
def test_stopping_once_no_longer_draft_can_win_changes_no_choice(
    curve: list[float], deep: list[float] | None, replays_beyond: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # _best stops pricing longer drafts on a curve that never falls (CostCurve.rises), once the
    # most they could add cannot win: the same γ, rate and best-ranked candidate as pricing all.
    # On a hybrid (replays_beyond) a longer draft's replay costs no less either.
    rng = np.random.default_rng(7)
    gap_dips = deep is not None and (deep[1] - curve[1]) < (deep[0] - curve[0])
    shortened = {True: 0, False: 0}  # by whether the curve rises at the trial's depth
    for trial in range(400):
        estimates = sorted(rng.uniform(0.0, 1.0, len(DEFAULT.support_priors)).tolist())
        draft_cost = float(rng.choice([0.0, 2e-5, 1e-3]))
        costs = CostCurve(list(curve), deep_seconds=list(deep) if deep else None)
        policy = AdaptiveDraftLength(costs, draft_cost, by_support=estimates, margin=0.05)
        policy.alpha = rng.uniform(0.0, 1.0, 16).tolist()
        policy.replays_beyond, policy.replay_overhead = replays_beyond, float(rng.choice([0.0, 1e-3, 5e-3]))
        limit, support, depth = int(rng.integers(1, 17)), int(rng.integers(0, 12)), int(rng.integers(0, 900))
        rises = costs.rises(depth)
        assert rises == (curve != DIPS and not (gap_dips and depth > costs.deep_depth))
        stopped = policy._best(limit, support, 0, depth, draft_cost, 0.05)
        top = max(policy._weighed, key=lambda c: c[1])[0]
        shortened[rises] += len(policy._weighed) < min(limit, policy.max_gamma) + 1
        with monkeypatch.context() as m:
            m.setattr(policy.costs, "rises", lambda depth=0: False)
            priced_all = policy._best(limit, support, 0, depth, draft_cost, 0.05)
            assert len(policy._weighed) == min(limit, policy.max_gamma) + 1
        assert stopped == priced_all, trial
        assert top == max(policy._weighed, key=lambda c: c[1])[0], trial
    assert shortened[False] == 0  # never where a longer pass may cost less
    assert shortened[True] > 50 or curve == DIPS, shortened  # and often where none does
