"""What one speculative step puts to the target: the guessed tokens, their probabilities
where the drafter has them, and where they came from."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localspec.core.drafting import Draft

if TYPE_CHECKING:
    from localspec.core.sampling import Distribution, TokenConstraint


class Source(enum.Enum):
    """Who proposed a step's tokens; the engine's bookkeeping differs per source."""

    MODEL = "model"  # the draft model (or no drafter: γ = 0)
    FREE = "free"  # a free drafter (n-gram lookup) that is the request's only drafter
    LOOKUP = "lookup"  # a free lookup beside a draft model, chosen over the model this step
    GRAMMAR = "grammar"  # what the request's grammar forces next (jump-forward)


@dataclass(frozen=True)
class Proposal:
    """A chain of guesses: token i is a guess for the position after token i-1. A tree of
    guesses (EAGLE-2, DFlash) also has each token's parent (localspec.core.tree.grow); a
    chain has none, so the engine's chain path reads nothing more than it did."""

    tokens: list[int]
    dists: list[Distribution] | None  # one per token, None for a guess without probabilities
    source: Source
    support: int = 0  # how well the context backs the guess (Draft.support)
    gamma: int = 0  # the length the policy chose (the tokens can fall short of it)
    backlog: int = 0  # tokens the draft model caught up on before guessing
    # A free drafter's whole guess made this step (longer than what was verified, or passed
    # over for the model's): what no step verifies is scored later as free evidence.
    guess: Draft | None = None
    # A tree: parents[i] is the index of token i's parent, -1 for a child of the pending
    # token; parents come before their children. None: a chain (parents[i] == i - 1).
    parents: tuple[int, ...] | None = None
    # What the drafter offered beside its chain (Draft.branches) within the first gamma
    # positions, for the engine to grow a tree from where that pays.
    branches: tuple[tuple[int, list[int]], ...] = ()

    @classmethod
    def of(cls, draft: Draft, gamma: int, source: Source, backlog: int = 0, guess: Draft | None = None) -> Proposal:
        """The first gamma tokens of a drafter's draft."""
        dists = draft.dists[:gamma] if draft.dists is not None else None
        # A branch reaches no deeper than the chain may: γ is the step's limit on tokens kept.
        offered = tuple((d, b[: gamma - d]) for d, b in draft.branches if d < gamma) if draft.branches else ()
        return cls(draft.tokens[:gamma], dists, source, draft.support, gamma, backlog, guess, branches=offered)

    @classmethod
    def forced(cls, tokens: list[int]) -> Proposal:
        """A point-mass draft of what the grammar forces: verified like any other, so exact
        whatever p is, and accepted surely where the mask leaves that one token."""
        return cls(tokens, None, Source.GRAMMAR, gamma=len(tokens))

    @property
    def guessed(self) -> bool:
        """The tokens are a free drafter's guess (the draft model's otherwise)."""
        return self.source in (Source.FREE, Source.LOOKUP)


def admissible(tokens: list[int], n_vocab: int, constraint: TokenConstraint | None) -> tuple[list[int], int | None]:
    """The leading tokens the target may evaluate, and where the rest was refused (None: none
    was). A drafter's vocabulary may be larger (padding slack): an id the target has no row
    for is a draft token the target rejects, never a block to evaluate; so is a token outside
    the request's grammar."""
    if not tokens:  # a plain step's: nothing to check
        return tokens, None
    refused = next((i for i, t in enumerate(tokens) if not 0 <= t < n_vocab), None)
    if constraint is not None:
        kept = tokens[:refused]
        if (allowed := constraint.allowed_prefix(kept)) < len(kept):
            refused = allowed
    return (tokens if refused is None else tokens[:refused]), refused
