"""Draft-length policies the tests and benchmarks set against the product's."""

from __future__ import annotations

from localspec.control.policy import FixedDraftLength


class DraftsFirstGuess(FixedDraftLength):
    """A fixed draft length that says the first guess would be drafted, so a request keeps the
    first token's own pass (Engine.generate folds it only where the first guess is declined):
    at length 0, the loop every n-gram request ran before that fold."""

    def would_guess(self, guessed: int, support: int, depth: int = 0) -> bool:
        return True
