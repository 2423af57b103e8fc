"""Draft rules that read the target's own confidence, replayed on the recorded answers (issue #58
item 5: no answer below 0.97x plain on Q4_1). Deterministic: simulated clock, no model runs.

    python benchmarks/confidence_rules.py [--signal] [--rules]

The confidence is recorded by benchmarks/record_confidence.py (tests/data/answer_confidence.json):
p1[i] and margin[i], the top-1 probability and top-1 minus top-2 of the target's row that chose
answer token i. A step that decides the next draft holds the row that chose its pending token
(answer[pos - 1] at answer position pos), never the row of the first token it drafts, which
the verify pass computes; the rules read only the former. The first step's pending token is
the prompt's, which no answer row chose: no rule acts there.

--signal: every draft the controller makes as landed, and every free guess (the n-gram drafter's
guess at every position, drafted or not), against the pending row's p1: how often the guess's
first token comes true per p1 bucket; beside it the same against the next row's p1 (what a rule
cannot read), the ceiling of any such signal.

--rules: the rules tried, each as a wrapper around the landed policy that cuts the step's
limit, on the golden and held-out answers on the Q4_1 and F16 curves: totals over plain
(golden, held out), the worst answer, and every answer under 1.0x on Q4_1 before and after.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.control.calibrate import Calibration
from localspec.control.config import DEFAULT
from localspec.control.factory import ngram_policy
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.replay import Traced, Truth, calibration_from_doctor, ngram_guesses, replay
from localspec.core.protocol import Decision, DraftPrices
from localspec.core.stats import Step
from localspec.drafters import common_prefix

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
CURVES = ("smollm2-135m-q4_1", "smollm2-135m-f16")
FILES = ("replay_answers.json", "heldout_answers.json")


@dataclass(frozen=True)
class Rule:
    """Where the pending row's confidence is under `below` (and the guess's support under
    `support_under`), a draft is capped at `cap` tokens (0: skipped). `signal`: "p1" or
    "margin"; `window`: the least over the last rows that many (1: the pending row's alone);
    `mean`: the window's mean instead of its least; `opening`: only a request's first draft;
    `oracle`: read the next `window` rows instead, those the verify pass computes (what no step
    has: the ceiling of the signal).
    `scale` (a, b): no cut, the guess's first α is multiplied by min(1, a + b * p1) instead."""

    name: str
    below: float = 0.0
    cap: int = 0
    signal: str = "p1"
    support_under: int = 1 << 30
    window: int = 1
    mean: bool = False
    opening: bool = False
    oracle: bool = False
    scale: tuple[float, float] | None = None


@dataclass
class Scaled(AdaptiveDraftLength):
    """The landed policy whose guess's first α is scaled by the pending row's confidence."""

    confidence: float = 1.0
    scale: tuple[float, float] = (1.0, 0.0)

    def chain(self, gamma: int, support: int = 0) -> list[float]:
        alpha = super().chain(gamma, support)
        if support > 0 and alpha:
            alpha[0] *= min(1.0, self.scale[0] + self.scale[1] * self.confidence)
        return alpha


class Gated:
    """The landed policy, its limit cut where the rule says the target is unsure."""

    def __init__(self, inner: AdaptiveDraftLength, rule: Rule, rows: Sequence[float], prompt_len: int) -> None:
        self.inner, self.rule, self.rows, self.prompt_len = inner, rule, rows, prompt_len
        self.cut = 0  # steps whose limit the rule cut
        self.drafted = False  # a draft was made in this request (opening)

    def read(self, depth: int) -> float | None:
        """The rule's reading of the target's confidence at this step (None: no row yet)."""
        pos = depth - self.prompt_len + 1  # answer tokens before the pending one's successor
        # The row that chose the pending token; an oracle's window looks ahead, from the row
        # that will choose the first drafted token.
        last = pos + self.rule.window - 1 if self.rule.oracle else pos - 1
        last = min(last, len(self.rows) - 1)
        if last < 0 or pos - 1 >= len(self.rows):
            return None
        seen = self.rows[max(0, last - self.rule.window + 1) : last + 1]
        return sum(seen) / len(seen) if self.rule.mean else min(seen)

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        confidence = self.read(depth)
        if isinstance(self.inner, Scaled):
            self.inner.confidence = 1.0 if confidence is None else confidence
            return self.inner.choose(limit, support, backlog, depth)
        unsure = confidence is not None and confidence < self.rule.below
        if self.rule.opening and self.drafted:
            unsure = False
        if support < self.rule.support_under and limit > self.rule.cap and unsure:
            self.cut += 1
            limit = self.rule.cap
            support = support if limit else 0  # a skipped guess is no guess, as the engine passes one
        gamma = self.inner.choose(limit, support, backlog, depth)
        self.drafted = self.drafted or gamma > 0
        return gamma

    def begin(self, sampled: bool) -> None:
        self.inner.begin(sampled)

    def would_draft(self, depth: int = 0) -> bool:
        return self.inner.would_draft(depth)

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        return self.inner.choose_source(guessed, support, limit, backlog, depth)

    def observe(self, step: Step) -> None:
        self.inner.observe(step)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        self.inner.observe_shadow(drafted, accepted, support, start)

    def explain(self) -> Decision | None:
        return self.inner.explain()

    def prices(self) -> DraftPrices | None:
        return self.inner.prices()


Answers = dict[str, dict[str, Any]]


def load_all() -> tuple[dict[str, Answers], dict[str, Any], dict[str, Calibration], int]:
    answers = {f: json.loads((DATA / f).read_text())["answers"] for f in FILES}
    confidence = json.loads((DATA / "answer_confidence.json").read_text())["answers"]
    stored = json.loads((DATA / "replay_curves.json").read_text())
    n_vocab = json.loads((DATA / FILES[0]).read_text())["n_vocab"]
    return answers, confidence, {c: calibration_from_doctor(stored[c]) for c in CURVES}, n_vocab


def speedups(
    answers: Answers, confidence: dict[str, Any], cal: Calibration, n_vocab: int, rule: Rule | None
) -> dict[str, tuple[float, float]]:
    """Per answer: plain seconds and the policy's seconds under the rule (None: as landed)."""
    truth, out = Truth.of(cal), {}
    for name, rec in answers.items():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        policy: Any = ngram_policy(cal.cost_curve())
        if rule is not None and rule.scale is not None:
            c = DEFAULT
            policy = Scaled(
                cal.cost_curve(), c.ngram_seconds_per_token, c.max_draft, margin=c.ngram_margin, scale=rule.scale
            )
        if rule is not None:
            policy = Gated(policy, rule, confidence[name][rule.signal], len(prompt))
        out[name] = (truth.plain(prompt, answer), replay(prompt, answer, truth, n_vocab, policy))
    return out


Replayed = dict[tuple[str, str], dict[str, tuple[float, float]]]  # (file, curve): answer: plain, ours


def total(per: dict[str, tuple[float, float]]) -> float:
    return sum(p for p, _ in per.values()) / sum(s for _, s in per.values())


RULES = [
    *(Rule(f"skip p1<{t}", t) for t in (0.3, 0.5, 0.7, 0.9)),
    *(Rule(f"cap 2 p1<{t}", t, cap=2) for t in (0.5, 0.7, 0.9)),
    *(Rule(f"cap 3 p1<{t}", t, cap=3) for t in (0.5, 0.7, 0.9)),
    *(Rule(f"skip margin<{t}", t, signal="margin") for t in (0.2, 0.4, 0.6, 0.8)),
    *(Rule(f"skip p1<{t} support<12", t, support_under=12) for t in (0.5, 0.7, 0.9)),
    *(Rule(f"skip min p1 of 3<{t}", t, window=3) for t in (0.3, 0.5, 0.7)),
    *(Rule(f"skip min p1 of 5<{t}", t, window=5) for t in (0.3, 0.5)),
    *(Rule(f"skip mean p1 of 16<{t}", t, window=16, mean=True) for t in (0.6, 0.7, 0.8)),
    *(Rule(f"opening: skip p1<{t}", t, opening=True) for t in (0.5, 0.7, 0.9)),
    *(Rule(f"opening: cap 3 p1<{t}", t, cap=3, opening=True) for t in (0.5, 0.7)),
    *(Rule(f"scale {a}+{b}p1", scale=(a, b)) for a, b in ((0.6, 0.45), (0.4, 0.7), (0.8, 0.25))),
    *(Rule(f"oracle: skip next p1<{t}", t, oracle=True) for t in (0.3, 0.5, 0.7)),
    *(Rule(f"oracle: skip min p1 of next 7<{t}", t, window=7, oracle=True) for t in (0.3, 0.5, 0.7)),
]


def rules(only: Sequence[str]) -> None:
    answers, confidence, curves, n_vocab = load_all()
    landed = {(f, c): speedups(answers[f], confidence[f], curves[c], n_vocab, None) for f in FILES for c in CURVES}
    chosen = [r for r in RULES if not only or r.name in only]
    print("totals over plain: golden / held out on Q4_1, then F16; worst answer on Q4_1 and F16")
    print(row("as landed", landed))
    results = {}
    for rule in chosen:
        got = {(f, c): speedups(answers[f], confidence[f], curves[c], n_vocab, rule) for f in FILES for c in CURVES}
        results[rule.name] = got
        print(row(rule.name, got, landed))
    for curve in CURVES:
        per_answer(curve, landed, results)


def per_answer(curve: str, landed: Replayed, results: dict[str, Replayed]) -> None:
    """Every answer under 1.0x on the curve as landed, one column each: landed, then each rule."""
    x = {n: p / s for f in FILES for n, (p, s) in landed[(f, curve)].items()}
    low = sorted((n for n in x if x[n] < 1.0), key=lambda n: x[n])
    where = {n: f for f in FILES for n in landed[(f, curve)]}
    print(f"\nevery answer under 1.0x on {curve} as landed, x plain")
    print(f"{'':34s} " + " ".join(f"{n[:9]:>9s}" for n in low))
    print(f"{'as landed':34s} " + " ".join(f"{x[n]:9.3f}" for n in low))
    for name, got in results.items():
        cells = [got[(where[n], curve)][n] for n in low]
        print(f"{name:34s} " + " ".join(f"{p / s:9.3f}" for p, s in cells))


def row(label: str, got: Replayed, base: Replayed | None = None) -> str:
    cells = []
    for c in CURVES:
        for f in FILES:
            t = total(got[(f, c)])
            delta = f"({t - total(base[(f, c)]):+.4f})" if base is not None else ""
            cells.append(f"{t:.4f}{delta}")
    worst = [min(p / s for f in FILES for p, s in got[(f, c)].values()) for c in CURVES]
    return f"{label:34s} " + " ".join(f"{c:>16s}" for c in cells) + f"  worst {worst[0]:.3f} {worst[1]:.3f}"


def signal() -> None:
    """First-token hit rate of drafts and free guesses per bucket of the pending row's p1."""
    answers, confidence, curves, n_vocab = load_all()
    edges = (0.3, 0.5, 0.7, 0.9, 0.99, 1.01)
    for label, offset in (("pending row (readable)", -1), ("next row (oracle)", 0)):
        guesses = [[0, 0] for _ in edges]
        for f in FILES:
            for name, rec in answers[f].items():
                prompt, answer = list(rec["prompt"]), list(rec["answer"])
                p1 = confidence[f][name]["p1"]
                for pos, guess in enumerate(ngram_guesses(prompt, answer, 8)):
                    if not guess or pos + offset < 0:
                        continue
                    b = next(i for i, e in enumerate(edges) if p1[pos + offset] < e)
                    guesses[b][0] += 1
                    guesses[b][1] += common_prefix(guess[:1], answer[pos : pos + 1])
        print(f"free guesses by the {label}'s p1: bucket, guesses, first token right")
        lo = 0.0
        for e, (n, hit) in zip(edges, guesses, strict=True):
            print(f"  [{lo:.2f}, {min(e, 1.0):.2f}) {n:5d} {hit / n if n else 0:.2f}")
            lo = e
    print("\nthe landed controller's drafts on Q4_1: answer, position, support:drafted/accepted, pending p1, next p1")
    cal = curves[CURVES[0]]
    truth = Truth.of(cal)
    for f in FILES:
        for name, rec in answers[f].items():
            prompt, answer = list(rec["prompt"]), list(rec["answer"])
            traced = Traced(ngram_policy(cal.cost_curve()))
            seconds = replay(prompt, answer, truth, n_vocab, traced)
            p1, pos, out = confidence[f][name]["p1"], 0, []
            for support, gamma, accepted in traced.steps:
                if gamma > 0:
                    before = f"{p1[pos - 1]:.2f}" if pos else "-"
                    out.append(f"@{pos} {support}:{gamma}/{accepted} {before} {p1[pos]:.2f}")
                pos += accepted + 1
            if out:
                print(f"{name:16s} {truth.plain(prompt, answer) / seconds:.3f}  " + ", ".join(out))


def host_cost(n_vocab: int, repeats: int = 2000) -> None:
    """Thread CPU µs to read the confidence off a row of logits the host already holds, as a
    step would: p1 from the row's picked token (one exp and sum over the row), and the margin
    (p1 and the runner-up: one more max over the row, its top masked)."""
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    pick = int(np.argmax(row))

    def p1() -> float:
        return float(1.0 / np.exp(row - row[pick]).sum())

    def margin() -> float:
        top = row[pick]
        row[pick] = -np.inf
        second = row.max()
        row[pick] = top
        return p1() * float(1.0 - np.exp(second - top))

    for label, work in (("p1", p1), ("p1 and margin", margin)):
        rounds = []
        for _ in range(7):
            start = time.thread_time_ns()
            for _ in range(repeats):
                work()
            rounds.append((time.thread_time_ns() - start) / repeats / 1e3)
        print(f"{label}: {min(rounds):.1f} µs a step (least of 7 rounds of {repeats}; rows of {n_vocab} float32)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", action="store_true")
    parser.add_argument("--rules", nargs="*", help="rule names (default: all)")
    parser.add_argument("--host-cost", action="store_true", help="µs to read the confidence off a row")
    args = parser.parse_args()
    if args.signal:
        signal()
    if args.rules is not None:
        rules(args.rules)
    if args.host_cost:
        host_cost(json.loads((DATA / FILES[0]).read_text())["n_vocab"])


if __name__ == "__main__":
    main()
