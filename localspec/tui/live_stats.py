"""The status line's figures, live while a reply streams and final once it is done.

Both come from the request's Stats, which every stream event carries; the steps themselves
are read only for the current γ and the plain-step baseline.

The speedup is an estimate, and labelled so: plain decoding would take one target pass per
token, so

    est. speedup = tokens per step × t_verify(1) / mean seconds per step

with t_verify(1) from the steps this reply ran with γ = 0 when it had a few (they carry the
same per-step overhead as the others), else from the controller's measured cost curve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from localspec.api import TextDelta
from localspec.core.stats import Stats

MIN_PLAIN_STEPS = 4
# An estimate below this is timing noise, not a slowdown: the controller drafts only where its
# measured costs say drafting pays, and falls back to plain steps (γ = 0) elsewhere.
NOISE_FLOOR = 0.9


class LiveFigures:
    """One reply's figures as its events arrive."""

    def __init__(self, modelled_plain_step: Callable[[], float | None] = lambda: None) -> None:
        # t_verify(1) from the controller's cost curve or the calibration (None: neither).
        self.modelled_plain_step = modelled_plain_step
        self.gamma = 0
        self.plain_steps = 0
        self.plain_seconds = 0.0

    def push(self, event: TextDelta) -> Figures | None:
        """The figures as of this event (None: it carries none)."""
        step = event.step
        if step is not None:
            self.gamma = step.gamma
            if step.drafted == 0:
                self.plain_steps += 1
                self.plain_seconds += step.draft_seconds + step.verify_seconds
        return live_figures(event.stats, self.gamma, self.plain_step_seconds()) if event.stats is not None else None

    def plain_step_seconds(self) -> float | None:
        """What one step of plain decoding costs. Steps this reply ran with γ = 0 measure it
        the way every other step is measured, so they win once there are a few; before that,
        the controller's cost model (t_verify(1)), or the calibration."""
        if self.plain_steps >= MIN_PLAIN_STEPS:
            return self.plain_seconds / self.plain_steps
        modelled = self.modelled_plain_step()
        if modelled is not None:
            return modelled
        return self.plain_seconds / self.plain_steps if self.plain_steps else None


@dataclass(frozen=True)
class Figures:
    """What the status line shows for one reply."""

    tokens: int
    tokens_per_s: float
    acceptance: float | None  # None: nothing drafted yet
    tokens_per_step: float
    gamma: float  # the current γ live; the mean γ once finished
    est_speedup: float | None
    strategy: str
    final: bool = False
    finish_reason: str = ""
    lookup_share: float = 0.0  # of the drafted tokens, those n-gram lookup beside a draft model guessed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figures | None:
        try:
            return cls(**data)
        except TypeError:
            return None  # saved by another version: show nothing rather than guess


def live_figures(stats: Stats, gamma: int, plain_step: float | None) -> Figures:
    return _figures(stats, plain_step, gamma=float(gamma))


def final_figures(stats: Stats, plain_step: float | None) -> Figures:
    return _figures(
        stats,
        plain_step,
        gamma=stats.mean_gamma,
        final=True,
        finish_reason=stats.finish_reason,
        lookup_share=stats.lookup_share,
    )


def _figures(stats: Stats, plain_step: float | None, **rest: Any) -> Figures:
    steps = stats.verify_steps
    mean_step = (stats.draft_seconds + stats.verify_seconds) / steps if steps else 0.0
    return Figures(
        tokens=stats.generated_tokens,
        tokens_per_s=stats.decode_tokens_per_s,
        acceptance=stats.acceptance_rate if stats.drafted else None,
        tokens_per_step=stats.tokens_per_step,
        est_speedup=estimate_speedup(stats.tokens_per_step, mean_step, plain_step),
        strategy=stats.strategy,
        **rest,
    )


def estimate_speedup(tokens_per_step: float, mean_step_seconds: float, plain_step: float | None) -> float | None:
    if plain_step is None or mean_step_seconds <= 0 or tokens_per_step <= 0:
        return None
    return tokens_per_step * plain_step / mean_step_seconds


def format_figures(f: Figures) -> str:
    accepted = f"{f.acceptance:.0%}" if f.acceptance is not None else "—"
    gamma = f"mean γ {f.gamma:.1f}" if f.final else f"γ {f.gamma:.0f}"
    if f.est_speedup is None:
        speedup = "est. speedup —"
    elif f.est_speedup < NOISE_FLOOR:
        speedup = "est. ≈ plain (timing too noisy to say more)"
    else:
        speedup = f"est. ×{f.est_speedup:.2f} vs plain"
    parts = [
        f"{f.tokens} tok",
        f"{f.tokens_per_s:.1f} tok/s",
        f"{accepted} accepted",
        f"{f.tokens_per_step:.2f} tok/step",
        gamma,
        speedup,
        f"{f.strategy} (n-gram lookup drafted {f.lookup_share:.0%})" if f.lookup_share else f.strategy,
    ]
    if f.final and f.finish_reason not in ("", "stop"):
        parts.append(f.finish_reason)
    return " · ".join(parts)
