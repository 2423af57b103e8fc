"""How the controller prices a block drafter (DFlash: one pass proposes the whole block) and
a hybrid target's long rejections (a replay of the kept tokens once the snapshots run out)."""

from __future__ import annotations

import itertools

import pytest

from localspec.control.costs import CostCurve
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.stats import Step

pytestmark = pytest.mark.spec

# A CPU-like target: a pass over k tokens costs 1 + 0.15 (k - 1) single steps (16 tokens: 3.25).
CURVE = [1.0 + 0.15 * k for k in range(16)]


def test_a_block_pass_is_charged_once_whatever_part_of_the_block_is_verified() -> None:
    block = AdaptiveDraftLength(CostCurve(CURVE), 0.0, max_gamma=15, prior=0.85, draft_seconds_per_pass=0.6)
    per_token = AdaptiveDraftLength(CostCurve(CURVE), 0.6, max_gamma=15, prior=0.85)
    assert block.rate(8) == pytest.approx(block.expected_tokens(8) / (0.6 + CURVE[8]))
    # The same 0.6 s charged per token leaves one token worth drafting; charged per pass, seven.
    assert per_token.choose(15) == 1
    assert block.choose(15) == 7


def test_a_block_is_cut_where_the_rest_would_not_pay() -> None:
    """The acceptance learnt per position of the block falls after its fourth token: only
    the prefix that pays is verified, though the pass proposed fifteen."""
    alpha = [0.95] * 4 + [0.05] * 11
    policy = AdaptiveDraftLength(CostCurve(CURVE), 0.0, max_gamma=15, alpha=alpha, draft_seconds_per_pass=0.3)
    assert policy.choose(15) == 4


def brute_force_replay(alpha: list[float], beyond: int, overhead: float, curve: list[float]) -> float:
    """Σ over every accept/reject pattern: its probability times what its rollback replays."""
    total = 0.0
    gamma = len(alpha)
    for outcome in itertools.product((True, False), repeat=gamma):
        p = 1.0
        for a, hit in zip(alpha, outcome, strict=True):
            p *= a if hit else 1.0 - a
        kept = next((i for i, hit in enumerate(outcome) if not hit), gamma)
        if gamma - kept > beyond:
            total += p * (overhead + curve[kept])  # a pass over the kept + 1 tokens
    return total


def test_a_hybrids_replay_is_priced_as_the_kept_tokens_pass_past_the_snapshots() -> None:
    alpha = [0.9, 0.7, 0.6, 0.5, 0.5, 0.4, 0.3, 0.3]
    policy = AdaptiveDraftLength(CostCurve(CURVE), 0.0, max_gamma=15, replays_beyond=4, replay_overhead=0.25)
    assert policy.replay_seconds(alpha) == pytest.approx(brute_force_replay(alpha, 4, 0.25, CURVE))
    assert policy.replay_seconds(alpha[:4]) == 0.0  # every rejection of four fits the snapshots
    dense = AdaptiveDraftLength(CostCurve(CURVE), 0.0, max_gamma=15)
    assert dense.replay_seconds(alpha) == 0.0


def test_the_replay_shortens_the_blocks_a_hybrid_verifies() -> None:
    def policy(beyond: int | None) -> AdaptiveDraftLength:
        return AdaptiveDraftLength(
            CostCurve(CURVE), 0.0, max_gamma=15, prior=0.9, draft_seconds_per_pass=0.3, replays_beyond=beyond
        )

    # Past four rejected tokens a block costs a replay too: the hybrid verifies less of it.
    dense, hybrid = policy(None).choose(15), policy(4).choose(15)
    assert dense > hybrid >= 4
    longest = policy(4)
    assert longest.rate(15) < policy(None).rate(15)  # the same block, dearer where it replays


def test_a_step_teaches_the_pass_curve_its_pass_and_the_replay_its_own_cost() -> None:
    policy = AdaptiveDraftLength(
        CostCurve(CURVE), 0.0, max_gamma=15, draft_seconds_per_pass=0.3, replays_beyond=4, replay_overhead=0.0
    )
    # 15 drafted, 2 kept: the pass over 16 took its curve's time, the replay of 3 tokens 1.5 s more.
    step = Step(drafted=15, accepted=2, draft_seconds=0.5, verify_seconds=CURVE[15] + 1.8, rollback_seconds=1.8)
    policy.observe(step)
    assert policy.costs.scale == pytest.approx(1.0)  # the replay did not make passes look dearer
    assert policy.replay_overhead == pytest.approx(policy.config.weight_hit * (1.8 - CURVE[2]))
    assert policy.draft_seconds_per_pass == pytest.approx(0.3 + policy.config.weight_hit * 0.2)
    assert policy.draft_seconds_per_token == 0.0


def test_a_replay_from_the_start_does_not_price_every_later_block() -> None:
    """The first long rejection on a hybrid replays the whole context (no state copy yet): a
    one-off, learnt as at most a pass over the verified block."""
    policy = AdaptiveDraftLength(CostCurve(CURVE), 0.0, max_gamma=15, replays_beyond=4)
    replayed_all = Step(drafted=15, accepted=0, draft_seconds=0.3, verify_seconds=CURVE[15] + 60, rollback_seconds=60)
    policy.observe(replayed_all)
    assert policy.replay_overhead == pytest.approx(policy.config.weight_hit * CURVE[15])
