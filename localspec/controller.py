"""Choosing the draft length γ for every step.

A draft of γ tokens costs γ drafter steps plus one target pass over γ+1 tokens and yields
E[accepted] + 1 tokens. On a 2-core CPU a pass over 4 tokens costs up to 3.4x a single-token
step, so a fixed γ loses on text the drafter cannot guess. The adaptive policy maximises

    tokens per second(γ) = (1 + Σ_{j≤γ} Π_{i≤j} α_i) / (γ·t_draft + t_verify(γ+1))

with α_i the acceptance rate at draft position i given that position i-1 was accepted,
estimated online, and t_verify the measured cost curve of the target. γ = 0 (plain
decoding) is always a candidate, which is what keeps localspec from losing to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class DraftLengthPolicy(Protocol):
    def choose(self, limit: int) -> int:
        """γ for the next step, at most limit."""
        ...

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None: ...

    def observe_shadow(self, drafted: int, accepted: int) -> None:
        """A free drafter's guess made while γ was 0, checked against what plain decoding
        then produced: acceptance evidence at no cost."""
        ...


@dataclass
class FixedDraftLength:
    gamma: int

    def choose(self, limit: int) -> int:
        return min(self.gamma, limit)

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        pass

    def observe_shadow(self, drafted: int, accepted: int) -> None:
        pass


@dataclass
class CostCurve:
    """t_verify[k-1] = seconds for one target pass over k tokens, k = 1..len."""

    verify_seconds: list[float]

    def __post_init__(self) -> None:
        if not self.verify_seconds or any(t <= 0 for t in self.verify_seconds):
            raise ValueError("a cost curve needs positive timings for k = 1..K")

    def verify(self, k: int) -> float:
        if k <= len(self.verify_seconds):
            return self.verify_seconds[k - 1]
        # Beyond the measured range, extend the last measured slope linearly.
        last = self.verify_seconds[-1]
        slope = last - self.verify_seconds[-2] if len(self.verify_seconds) > 1 else last
        return last + slope * (k - len(self.verify_seconds))

    def update(self, k: int, seconds: float, weight: float = 0.05) -> None:
        # Track drift (thermal limits, another process on the cores) without letting one
        # outlier (a page fault, a scheduler hiccup) move the curve much.
        if 1 <= k <= len(self.verify_seconds):
            old = self.verify_seconds[k - 1]
            self.verify_seconds[k - 1] = old + weight * (min(seconds, 3 * old) - old)


@dataclass
class AdaptiveDraftLength:
    costs: CostCurve
    draft_seconds_per_token: float
    max_gamma: int = 12
    prior: float = 0.5
    # EMA weights: a rejection counts more than an acceptance, because a wasted long draft
    # costs several plain steps while a missed chance costs only the gain it would have made.
    weight_hit: float = 0.15
    weight_miss: float = 0.3
    relax: float = 0.003  # per step, unobserved estimates drift back toward the prior
    alpha: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.prior] * self.max_gamma

    def expected_tokens(self, gamma: int) -> float:
        total, run = 1.0, 1.0
        for i in range(gamma):
            run *= self.alpha[i]
            total += run
        return total

    def rate(self, gamma: int) -> float:
        cost = gamma * self.draft_seconds_per_token + self.costs.verify(gamma + 1)
        return self.expected_tokens(gamma) / cost

    def choose(self, limit: int) -> int:
        # One pass: E[tokens](γ) grows by Π α_i at each step, so no γ is recomputed from scratch.
        best, best_rate = 0, 1.0 / self.costs.verify(1)
        expected, run = 1.0, 1.0
        for g in range(1, min(limit, self.max_gamma) + 1):
            run *= self.alpha[g - 1]
            expected += run
            r = expected / (g * self.draft_seconds_per_token + self.costs.verify(g + 1))
            if r > best_rate:
                best, best_rate = g, r
        return best

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        self.costs.update(drafted + 1, verify_seconds)
        if drafted == 0:
            self._relax(0)
            return
        per_token = draft_seconds / drafted
        self.draft_seconds_per_token += self.weight_hit * (per_token - self.draft_seconds_per_token)
        seen = min(accepted + 1, drafted)
        for i in range(seen):
            self._learn(i, 1.0 if i < accepted else 0.0)
        self._relax(seen)

    def observe_shadow(self, drafted: int, accepted: int) -> None:
        for i in range(min(accepted + 1, drafted)):
            self._learn(i, 1.0 if i < accepted else 0.0)

    def _learn(self, i: int, outcome: float) -> None:
        weight = self.weight_hit if outcome else self.weight_miss
        self.alpha[i] += weight * (outcome - self.alpha[i])

    def _relax(self, start: int) -> None:
        for i in range(start, self.max_gamma):
            self.alpha[i] += self.relax * (self.prior - self.alpha[i])


def choose_static(costs: Sequence[float], alpha: float, draft_cost: float, max_gamma: int) -> int:
    """γ for a constant acceptance rate: used by the bench and `doctor` to explain a choice."""
    policy = AdaptiveDraftLength(CostCurve(list(costs)), draft_cost, max_gamma=max_gamma, prior=alpha)
    return policy.choose(max_gamma)
