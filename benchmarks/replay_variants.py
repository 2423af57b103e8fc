"""Variants of the n-gram controller replayed side by side over recorded answers, on the
simulated clock of `localspec/control/replay.py` (which records the answers: run it first). What
decided how this version treats llama.cpp's graph rebuilds and when it learns from an
unverified guess.

    python benchmarks/replay_variants.py $LOCALSPEC_HOME/replay-*.json

Variants:
- localspec: the runtime's controller, as it is;
- whole-guess shadow: an unverified guess is scored only once all of it is known (before);
- curve with rebuilds: the controller sees every size at its cost after a pass of another
  size, as the calibration measured it before (each size timed once after another);
- rebuilds priced: the controller charges a draft the rebuild into its block and back into
  single tokens, and none to a draft of the same size as the one before.

Each answer's speedup is over plain decoding of it on the same clock; the summary gives the
geometric mean over all answers, how many are below 0.98x, and the worst.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from replay_drafters import adaptive

import localspec.core.engine as engine_module
from localspec.control.calibrate import Calibration
from localspec.control.costs import CostCurve
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.replay import Truth, rebuild_seconds, replay
from localspec.core.engine import Shadow
from localspec.drafters import common_prefix


@dataclass
class PricedCurve(CostCurve):
    """A cost curve that adds to each size the rebuilds a pass of that size would cause."""

    into_block: float = 0.0
    into_one: float = 0.0
    last: int = 0

    def verify(self, k: int, depth: int = 0) -> float:
        if k == self.last:
            extra = 0.0
        elif k == 1:  # the way back was charged to the draft that left single tokens
            extra = 0.0 if self.last > 1 else self.into_one
        else:
            extra = self.into_block + (self.into_one if self.last <= 1 else 0.0)
        return (self.measured(k, depth) + extra) * self.scale

    def update(self, k: int, seconds: float, depth: int = 0) -> None:
        paid = rebuild_seconds(k, self.last, self.into_block, self.into_one)
        ratio = min(seconds / (self.measured(k, depth) + paid), self.config.drift_clip)
        self.scale += self.config.drift_weight * (ratio - self.scale)
        self.last = k


def whole_guess_settle(self: Shadow, ctx: list[int], policy: object) -> bool:
    """Shadow.settle as it was: nothing is learnt until the guess is refuted or all known."""
    actual = ctx[self.at : self.at + len(self.guess)]
    matched = common_prefix(self.guess, actual)
    if matched < len(actual) or len(actual) == len(self.guess):
        policy.observe_shadow(len(self.guess), matched, self.support, self.start)  # type: ignore[attr-defined]
        return True
    return False


def with_rebuilds(cal: Calibration) -> CostCurve:
    """The curve as the calibration measured it before: each size after a pass of another."""
    rebuild = (cal.rebuild_block_seconds + cal.rebuild_one_seconds) / 2
    base = cal.cost_curve()
    deep = [t + rebuild for t in base.deep_seconds] if base.deep_seconds else None
    return replace(base, verify_seconds=[t + rebuild for t in base.verify_seconds], deep_seconds=deep)


def priced(cal: Calibration) -> CostCurve:
    base = cal.cost_curve()
    return PricedCurve(
        base.verify_seconds,
        deep_seconds=base.deep_seconds,
        depth=base.depth,
        deep_depth=base.deep_depth,
        into_block=cal.rebuild_block_seconds,
        into_one=cal.rebuild_one_seconds,
    )


@dataclass
class Tally:
    log_sum: float = 0.0
    answers: int = 0
    losses: int = 0
    worst: float = math.inf
    speedups: dict[str, float] = field(default_factory=dict)  # by answer

    def add(self, answer: str, speedup: float) -> None:
        self.log_sum += math.log(speedup)
        self.answers += 1
        self.losses += speedup < 0.98
        self.worst = min(self.worst, speedup)
        self.speedups[answer] = speedup


Variant = tuple[bool, Callable[[Calibration], AdaptiveDraftLength]]
VARIANTS: dict[str, Variant] = {
    "localspec": (False, lambda cal: adaptive(cal.cost_curve())),
    "whole-guess shadow": (True, lambda cal: adaptive(cal.cost_curve())),
    "curve with rebuilds": (False, lambda cal: adaptive(with_rebuilds(cal))),
    "both (before)": (True, lambda cal: adaptive(with_rebuilds(cal))),
    "rebuilds priced": (False, lambda cal: adaptive(priced(cal))),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recorded", nargs="+", help="answer files written by replay_drafters.py")
    args = parser.parse_args()
    tallies = {name: Tally() for name in VARIANTS}
    incremental = Shadow.settle
    print(f"| answers | plain | {' | '.join(VARIANTS)} |")
    print(f"|---|---|{'---|' * len(VARIANTS)}")
    for name in args.recorded:
        path = Path(name)
        data = json.loads(path.read_text())
        cal = Calibration.from_json(data["calibration"])
        if cal is None:
            raise SystemExit(f"{path} was recorded by an older localspec: delete it and record it again")
        sampled = path.stem.rsplit("-", 1)[-1].startswith("t")  # "...-160-t0.8x5": sampled answers
        truth = Truth.of(cal)
        plain_total, totals = 0.0, dict.fromkeys(VARIANTS, 0.0)
        label = path.stem.removeprefix("replay-")
        for answer_id, rec in data["answers"].items():
            prompt, answer = rec["prompt"], rec["answer"]
            plain = truth.plain(prompt, answer)
            plain_total += plain
            for variant, (whole_guess, make) in VARIANTS.items():
                engine_module.Shadow.settle = whole_guess_settle if whole_guess else incremental  # type: ignore[method-assign]
                try:
                    seconds = replay(prompt, answer, truth, data["n_vocab"], make(cal), sampled=sampled)
                finally:
                    engine_module.Shadow.settle = incremental  # type: ignore[method-assign]
                totals[variant] += seconds
                tallies[variant].add(f"{label}/{answer_id}", plain / seconds)
        print(f"| {label} | 1.00x | {' | '.join(f'{plain_total / t:.3f}x' for t in totals.values())} |")
    print()
    print(
        "| over all answers | geometric mean | below 0.98x | worst | localspec against it: best answer, worst answer |"
    )
    print("|---|---|---|---|---|")
    ours = tallies["localspec"].speedups
    for variant, tally in tallies.items():
        mean = math.exp(tally.log_sum / tally.answers)
        ratios = sorted((ours[a] / s, a) for a, s in tally.speedups.items())
        against = (
            ""
            if variant == "localspec"
            else f"{ratios[-1][0]:.3f}x ({ratios[-1][1]}), {ratios[0][0]:.3f}x ({ratios[0][1]})"
        )
        print(f"| {variant} | {mean:.4f}x | {tally.losses} of {tally.answers} | {tally.worst:.3f}x | {against} |")


if __name__ == "__main__":
    main()
