"""Choosing the draft length γ for every step.

A draft of γ tokens costs γ drafter steps plus one target pass over γ+1 tokens and yields
E[accepted] + 1 tokens. On a 2-core CPU a pass over 4 tokens costs up to 3.4x a single-token
step, so a fixed γ loses on text the drafter cannot guess. The adaptive policy maximises

    tokens per second(γ) = (1 + Σ_{j≤γ} Π_{i≤j} α_i) / (γ·t_draft + t_verify(γ+1))

with α_i the acceptance rate at draft position i given that position i-1 was accepted,
estimated online, and t_verify the measured cost curve of the target. γ = 0 (plain
decoding) is always a candidate, which is what keeps localspec from losing to it.

A free drafter (n-gram lookup) guesses before γ is chosen and says how well the context
supports its guess (the length of the matched passage). The α_i are then kept per support
level: a guess backed by a long match is right far more often than one backed by two tokens,
and one pooled estimate would either waste steps on the weak guesses or pass on the strong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Support levels (see the module doc): level i holds supports in [EDGES[i-1], EDGES[i]), level 0
# is "unknown" (model drafters). Each starts from a prior fitted to how often n-gram guesses
# of that support were right across the bench prompts on two precisions of SmolLM2-135M,
# shaded down so that a short reply, which leaves little time to learn, does not pay for
# optimism; the online estimates take over within a few steps.
SUPPORT_EDGES = (1, 2, 3, 4, 6, 8, 12, 20, 32)
SUPPORT_PRIORS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 0.85, 0.9, 0.95)


CATCH_UP_HORIZON = 4


def support_level(support: int) -> int:
    return sum(1 for edge in SUPPORT_EDGES if support >= edge)


@dataclass(frozen=True)
class StepOutcome:
    """What one verify step did: the policy learns acceptance and costs from it."""

    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    support: int = 0  # the draft's support (n-gram match length; 0: unknown)
    backlog: int = 0  # tokens the draft model caught up on before guessing


class DraftLengthPolicy(Protocol):
    def choose(self, limit: int, support: int = 0, backlog: int = 0) -> int:
        """γ for the next step, at most limit; support: how well the context backs a draft
        already made (0: unknown, or not drafted yet); backlog: tokens a draft model must
        catch up on before it can guess (Drafter.backlog)."""
        ...

    def observe(self, step: StepOutcome) -> None: ...

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        """A free drafter's guess (or the part of it from position `start` on, which no step
        verified), checked against what the target then produced: acceptance evidence at no
        cost. `accepted` counts the guess's leading tokens that came true."""
        ...


@dataclass
class FixedDraftLength:
    gamma: int

    def choose(self, limit: int, support: int = 0, backlog: int = 0) -> int:
        return min(self.gamma, limit)

    def observe(self, step: StepOutcome) -> None:
        pass

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        pass


@dataclass
class CostCurve:
    """t_verify[k-1] = seconds for one target pass over k tokens, k = 1..len, as measured at
    load, times `scale`: what the machine and the text's length make of it now."""

    verify_seconds: list[float]
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.verify_seconds or any(t <= 0 for t in self.verify_seconds):
            raise ValueError("a cost curve needs positive timings for k = 1..K")

    def measured(self, k: int) -> float:
        if k <= len(self.verify_seconds):
            return self.verify_seconds[k - 1]
        # Beyond the measured range, extend the last measured slope linearly.
        last = self.verify_seconds[-1]
        slope = last - self.verify_seconds[-2] if len(self.verify_seconds) > 1 else last
        return last + slope * (k - len(self.verify_seconds))

    def verify(self, k: int) -> float:
        return self.measured(k) * self.scale

    def update(self, k: int, seconds: float, weight: float = 0.05) -> None:
        # Drift (a longer context, thermal limits, another process on the cores) makes every
        # pass slower by about the same factor: one scale for the whole curve. Learning only
        # the observed k instead would make the sizes seldom drafted look cheap next to the
        # single-token step seen at every step, and draft where it does not pay. An outlier
        # (a page fault, a scheduler hiccup) is clipped and damped.
        ratio = min(seconds / self.measured(k), 3.0)
        self.scale += weight * (ratio - self.scale)


@dataclass
class AdaptiveDraftLength:
    costs: CostCurve
    draft_seconds_per_token: float
    max_gamma: int = 12
    prior: float = 0.5  # for drafts of unknown support
    # EMA weights: a rejection counts more than an acceptance, because a wasted long draft
    # costs several plain steps while a missed chance costs only the gain it would have made.
    weight_hit: float = 0.15
    weight_miss: float = 0.3
    relax: float = 0.003  # per step, unobserved estimates drift back toward their prior
    # What a draft model pays per token to catch up after sitting out steps (a batched pass),
    # charged spread over CATCH_UP_HORIZON steps: catching up once serves the drafts after it.
    catch_up_seconds_per_token: float = 0.0
    # Draft only when the predicted rate beats plain decoding by this share. The cost of a
    # draft model's step is an estimate that drifts with the machine, and near break-even a
    # wrong prediction loses more than a right one wins; a free drafter needs no margin.
    margin: float = 0.0
    alpha: list[float] = field(default_factory=list)  # per position, drafts of unknown support
    # by_support[level - 1][i]: the same per support level of a free drafter's guesses.
    by_support: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.prior] * self.max_gamma
        if not self.by_support:
            self.by_support = [[p] * self.max_gamma for p in SUPPORT_PRIORS]

    def _table(self, support: int) -> tuple[list[float], float]:
        level = support_level(support)
        if level == 0:
            return self.alpha, self.prior
        return self.by_support[level - 1], SUPPORT_PRIORS[level - 1]

    def expected_tokens(self, gamma: int, support: int = 0) -> float:
        alpha = self._table(support)[0]
        total, run = 1.0, 1.0
        for i in range(gamma):
            run *= alpha[i]
            total += run
        return total

    def rate(self, gamma: int, support: int = 0) -> float:
        cost = gamma * self.draft_seconds_per_token * self.costs.scale + self.costs.verify(gamma + 1)
        return self.expected_tokens(gamma, support) / cost

    def choose(self, limit: int, support: int = 0, backlog: int = 0) -> int:
        # One pass: E[tokens](γ) grows by Π α_i at each step, so no γ is recomputed from scratch.
        alpha = self._table(support)[0]
        best, best_rate = 0, (1.0 + self.margin) / self.costs.verify(1)
        expected, run = 1.0, 1.0
        # The drafter runs on the same cores over the same text: the target's drift is its too.
        draft_cost = self.draft_seconds_per_token * self.costs.scale
        catch_up = backlog * self.catch_up_seconds_per_token * self.costs.scale / CATCH_UP_HORIZON
        for g in range(1, min(limit, self.max_gamma) + 1):
            run *= alpha[g - 1]
            expected += run
            r = expected / (catch_up + g * draft_cost + self.costs.verify(g + 1))
            if r > best_rate:
                best, best_rate = g, r
        return best

    def observe(self, step: StepOutcome) -> None:
        drafted, accepted = step.drafted, step.accepted
        self.costs.update(drafted + 1, step.verify_seconds)
        table, prior = self._table(step.support)
        if drafted == 0:
            self._relax(table, prior, 0)
            return
        # The catch-up is not a cost of each drafted token: take it out before learning that.
        # Costs are kept in the units of the load-time measurement (divided by the drift).
        scale = self.costs.scale
        per_token = max(0.0, step.draft_seconds / scale - step.backlog * self.catch_up_seconds_per_token) / drafted
        self.draft_seconds_per_token += self.weight_hit * (per_token - self.draft_seconds_per_token)
        seen = min(accepted + 1, drafted)
        for i in range(seen):
            self._learn(table, i, 1.0 if i < accepted else 0.0)
        self._relax(table, prior, seen)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        if accepted < start:
            return  # the chain broke inside the verified part: nothing unverified was reached
        table = self._table(support)[0]
        for i in range(start, min(accepted + 1, drafted, self.max_gamma)):
            self._learn(table, i, 1.0 if i < accepted else 0.0)

    def _learn(self, table: list[float], i: int, outcome: float) -> None:
        weight = self.weight_hit if outcome else self.weight_miss
        table[i] += weight * (outcome - table[i])

    def _relax(self, table: list[float], prior: float, start: int) -> None:
        for i in range(start, self.max_gamma):
            table[i] += self.relax * (prior - table[i])


def choose_static(costs: Sequence[float], alpha: float, draft_cost: float, max_gamma: int) -> int:
    """γ for a constant acceptance rate: used by the bench and `doctor` to explain a choice."""
    policy = AdaptiveDraftLength(CostCurve(list(costs)), draft_cost, max_gamma=max_gamma, prior=alpha)
    return policy.choose(max_gamma)
