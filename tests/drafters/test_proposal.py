"""A step's Proposal and what of it the target may evaluate (admissible)."""

from __future__ import annotations

from collections.abc import Sequence

from localspec.core.drafting import Draft
from localspec.core.proposal import Proposal, Source, admissible


class FirstTwo:
    """A grammar that takes only the draft's first two tokens."""

    def allowed_prefix(self, draft: Sequence[int]) -> int:
        return min(2, len(draft))


def test_every_token_the_target_has_a_row_for_is_admissible() -> None:
    assert admissible([1, 2, 3], 10, None) == ([1, 2, 3], None)


def test_the_draft_ends_at_an_id_the_target_has_no_row_for() -> None:
    assert admissible([1, 12, 3], 10, None) == ([1], 1)
    assert admissible([-1, 2], 10, None) == ([], 0)


def test_the_draft_ends_where_the_grammar_stops_taking_it() -> None:
    assert admissible([1, 2, 3, 4], 10, FirstTwo()) == ([1, 2], 2)  # type: ignore[arg-type]


def test_a_proposal_keeps_the_first_gamma_tokens_and_their_distributions() -> None:
    draft = Draft([5, 6, 7], None, support=3)
    proposal = Proposal.of(draft, 2, Source.FREE, guess=draft)
    assert proposal.tokens == [5, 6] and proposal.gamma == 2 and proposal.support == 3
    assert proposal.guessed and proposal.guess is draft
    assert not Proposal.forced([4]).guessed and Proposal.forced([4]).source is Source.GRAMMAR
