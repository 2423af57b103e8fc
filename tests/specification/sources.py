"""A draft-length policy for tests of a draft model paired with n-gram lookup: it hands the
steps to the two sources in turn, so every request mixes lookup drafts, model drafts and the
model's catch-up on what the lookup drafted."""

from __future__ import annotations

from dataclasses import replace

from localspec import strategies
from localspec.assembly import assemble
from localspec.control.policy import FixedDraftLength
from localspec.core.protocol import Backend
from localspec.drafters.ngram import NgramDrafter
from localspec.runtime import Runtime


class AlternatingSources(FixedDraftLength):
    """γ fixed; the lookup drafts on even steps whenever it has a guess, the model otherwise."""

    def __init__(self, gamma: int) -> None:
        super().__init__(gamma)
        self.steps = 0
        self.from_lookup = 0
        self.from_model = 0

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        lookup = self.steps % 2 == 0 and guessed > 0
        self.steps += 1
        gamma = min(self.gamma, limit, guessed) if lookup else min(self.gamma, limit)
        if gamma > 0:
            self.from_lookup += lookup
            self.from_model += not lookup
        return gamma, lookup


def alternating_runtime(target: Backend, draft: Backend, gamma: int) -> Runtime:
    """A runtime drafting with `draft` and n-gram lookup in turn (AlternatingSources(gamma)),
    which the adaptive policy alone would not do on a CPU."""
    plan = replace(strategies.plan(target, draft, "draft", draft_tokens=gamma, calibrate=False), lookup=NgramDrafter())
    return Runtime(plan, assemble(plan, AlternatingSources(gamma)))
