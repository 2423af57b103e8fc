"""policy.explain(): the candidates the draft-length policy weighed and what decided."""

from __future__ import annotations

from localspec.control.costs import CostCurve
from localspec.control.policy import AdaptiveDraftLength, FixedDraftLength, decide_static

NEARLY_FREE = [10e-3 + 0.2e-3 * k for k in range(16)]


def test_the_decision_lists_plain_decoding_and_every_length_up_to_the_limit() -> None:
    decision = decide_static(NEARLY_FREE, alpha=0.9, draft_cost=0.0, max_gamma=8)
    assert [g for g, _ in decision.candidates] == list(range(9))
    assert decision.chosen == decision.best == max(decision.candidates, key=lambda c: c[1])[0] > 0
    assert decision.adjustment == ""
    assert "<- chosen" in decision.table().splitlines()[decision.chosen + 1]


def test_a_draft_within_the_margin_of_plain_decoding_is_explained_as_the_margin() -> None:
    # Every draft predicts 1% over plain decoding: the fastest candidate, but not by the margin.
    policy = AdaptiveDraftLength(CostCurve([0.01, 0.0198]), 0.0, max_gamma=1, prior=1.0, margin=0.1)
    assert policy.choose(1) == 0
    decision = policy.explain()
    assert decision is not None
    assert decision.best == 1 and decision.chosen == 0
    assert "10%" in decision.adjustment


def test_a_policy_that_chose_nothing_yet_has_nothing_to_explain() -> None:
    assert AdaptiveDraftLength(CostCurve(NEARLY_FREE), 0.0).explain() is None


def test_a_fixed_length_explains_itself_as_fixed() -> None:
    decision = FixedDraftLength(4).explain()
    assert decision is not None and decision.chosen == 4 and decision.source == "fixed"
