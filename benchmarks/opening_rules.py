"""Pricing a request's opening draft from the recorded opening outcomes (issue #58 item 5), as
variants beside today's policy: golden and held-out answers replayed on the Q4_1 and F16 curves,
the total over plain and the worst answer per set, and every answer that moved by 0.005 or more.

    python benchmarks/opening_rules.py [VARIANT ...]    (default: the sweep below)

A variant is "mode:k:n[:f]": until the request's first n-gram draft, a guess of support s is priced
with the chain of the golden answers' first guesses of support s or more
(results/2026-11-29-opening/opening_outcomes.json, benchmarks/opening_outcomes.py), each position's hits
and trials blended with the policy's own estimate for that position counted as k trials, where
at least n openings were recorded and s >= f (elsewhere the policy's own chain). mode "price" replaces the
chain, "min" takes the lower of the two per position, "cap" keeps the policy's chain but drafts
at most the length that rates best under the opening chain; "q" drafts at most the k-quantile
of the recorded openings' kept tokens (k a share: 0.5 the median), "qf" the same but at least 1.
Deterministic: simulated clock, no model runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.control.config import DEFAULT
from localspec.control.costs import CostCurve
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.replay import Truth, calibration_from_doctor, replay
from localspec.core.stats import Step

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
RECORDED = ROOT / "benchmarks" / "results" / "2026-11-29-opening" / "opening_outcomes.json"
OPENINGS: dict[str, list[list[Any]]] = json.loads(RECORDED.read_text())["supports"]
CURVES = ("smollm2-135m-q4_1", "smollm2-135m-f16")
SETS = {"g": "replay_answers.json", "h": "heldout_answers.json"}
SWEEP = (
    "price:0:8", "price:2:8", "price:5:8", "price:10:8", "min:0:8", "min:2:8", "min:5:8",
    "cap:0:8", "cap:2:8", "cap:5:8", "price:2:15", "min:2:15", "cap:2:15", "cap:0:15",
    "q:0.5:8", "q:0.75:8", "qf:0.35:8", "qf:0.25:8",
    "qf:0.25:8:8", "qf:0.35:8:8", "cap:0:8:8", "price:0:8:8", "min:0:8:8",
)  # fmt: skip


def counts(rows: list[list[Any]], positions: int) -> list[tuple[int, int]]:
    """(hits, trials) per draft position of the recorded openings: a position is tried where the
    guess offered it and every token before it was kept."""
    out = []
    for i in range(positions):
        tried = [kept for _, _, offered, kept in rows if offered > i and kept >= i]
        out.append((sum(kept > i for kept in tried), len(tried)))
    return out


@dataclass
class OpeningPriced(AdaptiveDraftLength):
    mode: str = "price"
    weight: float = 0.0
    least: int = 8
    floor: int = 0  # the rule reads only guesses of at least this support
    _opening: bool = field(default=True, repr=False)

    def begin(self, sampled: bool) -> None:
        self._opening = True
        super().begin(sampled)

    def observe(self, step: Step) -> None:
        super().observe(step)
        if step.drafted > 0 and step.support > 0:
            self._opening = False

    def opening_chain(self, gamma: int, support: int) -> list[float] | None:
        rows = OPENINGS.get(str(min(support, max(int(s) for s in OPENINGS))))
        if not self._opening or self.sampled or support < max(1, self.floor) or rows is None or len(rows) < self.least:
            return None
        own = super().chain(gamma, support)
        out = []
        for (hits, trials), mine in zip(counts(rows, gamma), own, strict=True):
            blended = (hits + self.weight * mine) / (trials + self.weight) if trials + self.weight > 0 else mine
            out.append(min(blended, mine) if self.mode == "min" else blended)
        return out

    def chain(self, gamma: int, support: int = 0) -> list[float]:
        opening = self.opening_chain(gamma, support) if self.mode in ("price", "min") else None
        return opening if opening is not None else super().chain(gamma, support)

    def _best(
        self, limit: int, support: int, backlog: int, depth: int, per_token: float, margin: float
    ) -> tuple[int, float]:
        if self.mode in ("q", "qf") and self._opening and not self.sampled and support >= max(1, self.floor):
            rows = OPENINGS.get(str(min(support, max(int(s) for s in OPENINGS))))
            if rows is not None and len(rows) >= self.least:
                kept = sorted(r[3] for r in rows)
                cap = kept[min(len(kept) - 1, int(self.weight * len(kept)))]
                limit = min(limit, max(cap, 1) if self.mode == "qf" else cap)
                if limit == 0:
                    plain = 1.0 / self.costs.verify(1, depth)
                    self._weighed, self._cut = [(0, plain)], "the opening's outcomes keep nothing here"
                    return 0, plain
        opening = self.opening_chain(min(limit, self.max_gamma), support) if self.mode == "cap" else None
        if opening:
            rates, expected, run = [1.0 / self.costs.verify(1, depth)], 1.0, 1.0
            for g, a in enumerate(opening, 1):
                run *= a
                expected += run
                rates.append(expected / self.costs.verify(g + 1, depth))
            limit = max(range(len(rates)), key=lambda g: rates[g])
            if limit == 0:  # the opening chain prices no draft as paying: the cap leaves none
                self._weighed, self._cut = [(0, rates[0])], "the opening's outcomes price no draft"
                return 0, rates[0]
        return super()._best(limit, support, backlog, depth, per_token, margin)


def policy(curve: CostCurve, spec: str) -> AdaptiveDraftLength:
    if spec == "base":
        return AdaptiveDraftLength(curve, DEFAULT.ngram_seconds_per_token, margin=DEFAULT.ngram_margin)
    mode, weight, least, *floor = spec.split(":")
    return OpeningPriced(
        curve, DEFAULT.ngram_seconds_per_token, margin=DEFAULT.ngram_margin, mode=mode, weight=float(weight),
        least=int(least), floor=int(floor[0]) if floor else 0,
    )  # fmt: skip


def run(spec: str) -> dict[tuple[str, str], tuple[float, dict[str, float]]]:
    stored = json.loads((DATA / "replay_curves.json").read_text())
    out = {}
    for curve in CURVES:
        cal = calibration_from_doctor(stored[curve])
        truth = Truth.of(cal)
        for tag, file in SETS.items():
            answers = json.loads((DATA / file).read_text())
            plain = ours = 0.0
            per = {}
            for name, rec in answers["answers"].items():
                prompt, answer = list(rec["prompt"]), list(rec["answer"])
                base = truth.plain(prompt, answer)
                seconds = replay(prompt, answer, truth, answers["n_vocab"], policy(cal.cost_curve(), spec))
                plain, ours, per[name] = plain + base, ours + seconds, base / seconds
            out[(curve, tag)] = (plain / ours, per)
    return out


def main(specs: list[str]) -> None:
    base = run("base")
    for spec in ["base", *specs]:
        mine = run(spec) if spec != "base" else base
        cells, moves = [], []
        for key, (total, per) in mine.items():
            before = base[key][1]
            worst = min(per, key=lambda n: per[n])
            cells.append(f"{key[0][-4:]} {key[1]} {total:.4f} ({total - base[key][0]:+.4f}) {worst} {per[worst]:.3f}")
            moved = [f"{n} {before[n]:.3f}->{v:.3f}" for n, v in per.items() if abs(v - before[n]) >= 0.005]
            if moved:
                moves.append(f"    {key[0][-4:]} {key[1]}: " + ", ".join(moved))
        print(f"{spec:12s} " + " | ".join(cells))
        for line in moves:
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:] or list(SWEEP))
