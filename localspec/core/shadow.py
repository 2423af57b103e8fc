"""Free evidence: what of a free drafter's guess no verify step checked, scored for the
draft-length policy as the text it guessed becomes known."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.core.drafting import DraftLengthPolicy, common_prefix
from localspec.core.proposal import Proposal


def shadow_of(proposal: Proposal, verified: int, n_acc: int, at: int) -> Shadow | None:
    """What of the step's free guess (at context position `at`) no step verified, to be scored
    once the text is known: free evidence. Past a rejected token a guess cannot come true."""
    guess = proposal.guess
    checked = verified if proposal.guessed else 0  # all of a guess the model drafted instead
    if guess is None or checked >= len(guess.tokens) or (proposal.guessed and n_acc != checked):
        return None
    return Shadow(guess.tokens, at, guess.support, checked)


@dataclass
class Shadow:
    """The part of a free drafter's guess from position `start` on, which no verify step
    checked; scored as free acceptance evidence token by token as the text it guessed
    becomes known. Scored only once the whole guess was known, a copy in progress would hold
    its evidence back for up to engine.FREE_GUESS_TOKENS steps, just while the controller decides
    whether the text is being copied (benchmarks/replay_variants.py)."""

    guess: list[int]
    at: int  # where the guess begins in the context
    support: int
    start: int  # the first position not yet scored

    def settle(self, ctx: list[int], policy: DraftLengthPolicy) -> bool:
        """Score what is known of the guess so far; True when nothing is left to score."""
        actual = ctx[self.at : self.at + len(self.guess)]
        matched = common_prefix(self.guess, actual)
        if matched < len(actual) or len(actual) == len(self.guess):
            policy.observe_shadow(len(self.guess), matched, self.support, self.start)
            return True
        if matched > self.start:  # all known so far came true: learn those hits now
            policy.observe_shadow(matched, matched, self.support, self.start)
            self.start = matched
        return False
