"""The status line's figures, live while a reply streams and final once it is done.

Live figures come from a recorder wrapped around the runtime's draft-length policy: the
engine tells the policy every verify step's γ, drafted and accepted counts and timings, so
the recorder sees exactly what Stats will say at the end, as it happens.

The speedup is an estimate, and labelled so: plain decoding would take one target pass per
token, so

    est. speedup = tokens per step × t_verify(1) / mean seconds per step

with t_verify(1) from the steps this reply ran with γ = 0 when it had a few (they carry the
same per-step overhead as the others), else from the controller's measured cost curve.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from localspec.controller import DraftLengthPolicy, StepOutcome
from localspec.stats import Stats

MIN_PLAIN_STEPS = 4


class StepRecorder:
    """A DraftLengthPolicy that passes everything to the real one and counts as it goes."""

    def __init__(self, inner: DraftLengthPolicy, measured_plain_step: float | None = None) -> None:
        self.inner = inner
        self.measured_plain_step = measured_plain_step  # t_verify(1) from calibration, if known
        self.reset()

    def reset(self) -> None:
        self.started: float | None = None
        self.gamma = 0
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.step_seconds = 0.0
        self.plain_steps = 0
        self.plain_seconds = 0.0

    def would_draft(self, depth: int = 0) -> bool:
        return self.inner.would_draft(depth)

    def begin(self, sampled: bool) -> None:
        self.inner.begin(sampled)

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        if self.started is None:
            self.started = time.perf_counter()
        self.gamma = self.inner.choose(limit, support, backlog, depth)
        return self.gamma

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        if self.started is None:
            self.started = time.perf_counter()
        self.gamma, from_lookup = self.inner.choose_source(guessed, support, limit, backlog, depth)
        return self.gamma, from_lookup

    def observe(self, step: StepOutcome) -> None:
        self.inner.observe(step)
        seconds = step.draft_seconds + step.verify_seconds
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.step_seconds += seconds
        if step.drafted == 0:
            self.plain_steps += 1
            self.plain_seconds += seconds

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        self.inner.observe_shadow(drafted, accepted, support, start)

    def plain_step_seconds(self) -> float | None:
        """What one step of plain decoding costs. Steps this reply ran with γ = 0 measure it
        the way every other step is measured, so they win once there are a few; before that,
        the controller's cost model (t_verify(1)), or the calibration."""
        if self.plain_steps >= MIN_PLAIN_STEPS:
            return self.plain_seconds / self.plain_steps
        costs = getattr(self.inner, "costs", None)
        if costs is not None and hasattr(costs, "verify"):
            return float(costs.verify(1))
        if self.measured_plain_step is not None:
            return self.measured_plain_step
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


def live_figures(recorder: StepRecorder, tokens: int, strategy: str) -> Figures:
    elapsed = time.perf_counter() - recorder.started if recorder.started is not None else 0.0
    per_step = tokens / recorder.steps if recorder.steps else 0.0
    mean_step = recorder.step_seconds / recorder.steps if recorder.steps else 0.0
    return Figures(
        tokens=tokens,
        tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
        acceptance=recorder.accepted / recorder.drafted if recorder.drafted else None,
        tokens_per_step=per_step,
        gamma=float(recorder.gamma),
        est_speedup=estimate_speedup(per_step, mean_step, recorder.plain_step_seconds()),
        strategy=strategy,
    )


def final_figures(stats: Stats, plain_step: float | None) -> Figures:
    steps = stats.verify_steps
    mean_step = (stats.draft_seconds + stats.verify_seconds) / steps if steps else 0.0
    return Figures(
        tokens=stats.generated_tokens,
        tokens_per_s=stats.decode_tokens_per_s,
        acceptance=stats.acceptance_rate if stats.drafted else None,
        tokens_per_step=stats.tokens_per_step,
        gamma=stats.mean_gamma,
        est_speedup=estimate_speedup(stats.tokens_per_step, mean_step, plain_step),
        strategy=stats.strategy,
        final=True,
        finish_reason=stats.finish_reason,
        lookup_share=stats.lookup_share,
    )


def estimate_speedup(tokens_per_step: float, mean_step_seconds: float, plain_step: float | None) -> float | None:
    if plain_step is None or mean_step_seconds <= 0 or tokens_per_step <= 0:
        return None
    return tokens_per_step * plain_step / mean_step_seconds


def format_figures(f: Figures) -> str:
    accepted = f"{f.acceptance:.0%}" if f.acceptance is not None else "—"
    gamma = f"mean γ {f.gamma:.1f}" if f.final else f"γ {f.gamma:.0f}"
    speedup = f"est. ×{f.est_speedup:.2f} vs plain" if f.est_speedup is not None else "est. speedup —"
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
