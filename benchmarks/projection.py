"""What a drafter would add, projected from measured pass costs: the speedup of a fixed draft
length at a given acceptance, and the draft length the controller settles on (simulated steps
with the policy a runtime builds for a draft model). Shared by the GPU and hybrid benchmarks."""

from __future__ import annotations

from collections import Counter

import numpy as np

from localspec.control.costs import CostCurve
from localspec.control.factory import model_policy
from localspec.core.stats import Step


def expected_tokens(gamma: int, alpha: float) -> float:
    return sum(alpha**j for j in range(gamma + 1))


def speedup(target: list[float], draft: float, gamma: int, alpha: float) -> float:
    """Tokens per second over plain decoding's, with every drafted token kept with chance alpha;
    target[k-1] is the cost of a pass over k tokens."""
    cost = gamma * draft + (target[gamma] if gamma < len(target) else target[-1])
    return expected_tokens(gamma, alpha) * target[0] / cost


def adaptive_gamma(target: list[float], draft: float, alpha: float, steps: int = 600) -> int:
    """The γ the controller settles on over simulated steps with these costs and acceptance,
    set up as a runtime sets it up for a draft model (its load-time agreement measures alpha)."""
    policy = model_policy(CostCurve(list(target)), draft, alpha)
    limit = len(target) - 1
    rng = np.random.default_rng(0)
    chosen: Counter[int] = Counter()
    for i in range(steps):
        gamma = policy.choose(limit)
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        policy.observe(Step(gamma, accepted, gamma * draft, target[gamma]))
        if i >= steps // 2:
            chosen[gamma] += 1
    settled: int = chosen.most_common(1)[0][0]
    return settled


def projection_rows(
    target: list[float], draft: float, alphas: tuple[float, ...]
) -> list[tuple[float, int, float, int, float]]:
    """(alpha, best fixed γ, its speedup, the controller's γ, its speedup) per acceptance."""
    rows = []
    for alpha in alphas:
        fixed = {g: speedup(target, draft, g, alpha) for g in range(len(target))}
        best = max(fixed, key=lambda g: fixed[g])
        chosen = adaptive_gamma(target, draft, alpha)
        rows.append((alpha, best, fixed[best], chosen, fixed[chosen]))
    return rows
