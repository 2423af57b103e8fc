"""What a drafter would add, projected from measured pass costs: the speedup of a fixed draft
length at a given acceptance, and the draft length the controller settles on (simulated steps
with the policy a runtime builds for a draft model, localspec/control/replay.py). Shared by the
GPU and hybrid benchmarks."""

from __future__ import annotations

from localspec.control.replay import constant_acceptance, fixed_speedup


def projection_rows(
    target: list[float], draft: float, alphas: tuple[float, ...]
) -> list[tuple[float, int, float, int, float]]:
    """(alpha, best fixed γ, its speedup, the γ the controller settles on, the speedup of its
    choices) per acceptance."""
    rows = []
    for alpha in alphas:
        fixed = {g: fixed_speedup(target, draft, g, alpha) for g in range(len(target))}
        best = max(fixed, key=lambda g: fixed[g])
        chosen, reached = constant_acceptance(target, draft, alpha)
        rows.append((alpha, best, fixed[best], chosen, reached))
    return rows
