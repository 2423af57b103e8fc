"""Two more signals of whether an n-gram guess comes true, beside its support (the length of the
matched passage), replayed on the recorded answers (issue #58 item 6: draft where lookup wins
on F16). Deterministic: simulated clock, no model runs.

- counted: llama-lookup's own rule, the most frequent follower of the text's last 1- to 4-gram
  (localspec.control.replay.LookupCache), agrees with the guess's first token, disagrees, or
  has too few counts to say;
- resync: the passage matches the text's end across one substituted token (a renamed value:
  "A B C x D" against "A B C y D" matches 4 tokens, not 1), the longest such match among the
  earlier occurrences of the last token;
- consensus: the share of the last token's earlier occurrences that the guess's first token
  followed (half or more, or less);
- copied: whether the token the guess copies from was itself guessed right when it was written
  (a line that copies the line before, whose own copy came true), or lies in the prompt.

    python benchmarks/guess_signals.py [--signal] [--replay] [--doctor REPORT.json ...]

--signal: how often the guess's first token comes true, per support level (levels 1-5: supports 1,
2, 3, 4-5 and 6-7 tokens), in all and per signal.
--doctor REPORT.json (repeatable) replays on the curves `localspec doctor --json` measured instead
of the two stored ones.

--replay: the geometric mean over each answer set of n-gram's speedup over plain decoding and
over llama-lookup at γ=4 and γ=8, on the stored Q4_1 and F16 curves, with the drafter as it is
and with each signal used: "counted" raises a weak guess's support (1 or 2 tokens) by one where
lookup's counted follower is its first token, "resync" copies from the best match
across a substitution, at support 4, where the exact match is 1 or 2 tokens and that one 6+;
"consensus" and "copied" raise a weak guess's support by one where the signal is for it and
lower it by one (to no less than 1) where it is against;
"ceiling" drafts exactly what comes true of today's guesses, a bound no controller reaches.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localspec.control.factory import ngram_policy
from localspec.control.policy import support_level
from localspec.control.replay import (
    LookupCache,
    Truth,
    calibration_from_doctor,
    ceiling,
    ngram_guesses,
    replay,
    replay_lookup,
)
from localspec.core.sampling import SamplingConfig
from localspec.drafters import Draft
from localspec.drafters.matching import longest_match
from localspec.drafters.ngram import CANDIDATES, NgramDrafter

ROOT = Path(__file__).resolve().parent.parent
SETS = {
    "golden": ROOT / "tests/data/replay_answers.json",
    "held-out (Q4_1 answers)": ROOT / "tests/data/heldout_answers.json",
    "held-out (F16 answers)": ROOT / "tests/data/heldout_answers_f16.json",
}
CURVES = ("smollm2-135m-q4_1", "smollm2-135m-f16")


def after_last(text: Sequence[int]) -> list[int]:
    """Positions right after every earlier occurrence of the text's last token, newest last."""
    last = text[-1]
    return [i + 1 for i in range(len(text) - 1) if text[i] == last][-64:]


def across_one(text: Sequence[int], pos: int, most: int = 32) -> int:
    """Tokens before `pos` that match the text's end, across at most one substituted token."""
    size, matched, back, missed = len(text), 0, 0, 0
    while matched < most and pos - back - 1 >= 0 and pos - back - 1 < size - back - 1:
        if text[pos - back - 1] == text[size - back - 1]:
            matched += 1
        elif missed:
            break
        else:
            missed = 1
        back += 1
    return matched


def follower(counts: LookupCache, text: Sequence[int]) -> int | None:
    """llama-lookup's guess of the next token: its counted follower under its lax thresholds."""
    return counts.follower(text, LookupCache.MIN_SAMPLES, LookupCache.MIN_PERCENT)


def consensus(found: Sequence[int], text: Sequence[int], first: int) -> float:
    """The share of the last token's earlier occurrences (the positions after them) that
    `first` followed."""
    followers = [text[q] for q in found if q < len(text)]
    return sum(t == first for t in followers) / max(1, len(followers))


def source(found: Sequence[int], text: Sequence[int]) -> int:
    """Where the n-gram drafter's guess copies from (its longest match, the newest on a tie)."""
    match = longest_match(text, text, list(found[-CANDIDATES:]), 1, 32)
    assert match is not None
    return match[0]


class Signalled(NgramDrafter):
    """The n-gram drafter with one signal used (mode "as is": none)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.counts = LookupCache([])
        self.guessed: dict[int, bool] = {}  # position: whether its token was the guess made before it
        self._last: tuple[int, int] | None = None  # the last guess's position and first token

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        super().start(context, warm)
        self.counts = LookupCache(context)

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        if self._last is not None and len(context) > self._last[0]:
            self.guessed[self._last[0]] = context[self._last[0]] == self._last[1]
        draft = super().propose(context, n, cfg, rng)
        self.counts.add(context[len(self.counts.tokens) :])  # the committed text only grows
        self._last = (len(context), draft.tokens[0]) if draft.tokens else None
        if not draft.tokens or draft.support > 2 or self.mode == "as is":
            return draft
        if self.mode == "counted":
            agrees = follower(self.counts, context) == draft.tokens[0]
            return Draft(tokens=draft.tokens, support=draft.support + agrees)
        if self.mode in ("consensus", "copied"):
            found = self._index.get((context[-1],), [])
            if self.mode == "consensus":
                vote = consensus(found, context, draft.tokens[0]) >= 0.5
            else:
                vote = self.guessed.get(source(found, context), False)
            return Draft(tokens=draft.tokens, support=max(1, draft.support + (1 if vote else -1)))
        best = max(reversed(after_last(context)), key=lambda p: across_one(context, p))
        if across_one(context, best) < 6:
            return draft
        tokens = list(context[best : best + n])
        return Draft(tokens=tokens, support=4) if len(tokens) == n else draft


def signal_table(answers: list[dict[str, Any]]) -> None:
    seen: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    for rec in answers:
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        drafter, counts = NgramDrafter(), LookupCache(prompt)
        drafter.start(prompt)
        guessed: dict[int, bool] = {}
        for i in range(len(answer) - 1):
            text = prompt + answer[:i]
            guess = drafter.propose(text, 16, cfg, rng)
            if guess.tokens:
                guessed[len(text)] = guess.tokens[0] == answer[i]
                said = {None: "none", guess.tokens[0]: "agrees"}.get(follower(counts, text), "disagrees")
                resync = max((across_one(text, p) for p in after_last(text)), default=0)
                found = drafter._index.get((text[-1],), [])
                share = consensus(found, text, guess.tokens[0])
                at = source(found, text)
                copied = "in the prompt" if at < len(prompt) else "yes" if guessed.get(at, False) else "no"
                level = support_level(guess.support)
                keys = (
                    (level, "all"),
                    (level, f"counted {said}"),
                    (level, "resync 6+" if resync >= 6 else "resync <6"),
                    (level, "consensus >=0.5" if share >= 0.5 else "consensus <0.5"),
                    (level, f"copied {copied}"),
                )
                for key in keys:
                    seen[key][0] += guess.tokens[0] == answer[i]
                    seen[key][1] += 1
            counts.add(answer[i : i + 1])
    print("support level, signal: guesses, first token right")
    for (level, signal), (right, total) in sorted(seen.items()):
        if level <= 5:
            print(f"{level:2d} {signal:20s} {total:6d} {right / total:6.2f}")


def _seconds(mode: str, prompt: list[int], answer: list[int], truth: Truth, n_vocab: int, cal: Any) -> float:
    """Simulated seconds of the answer under the controller with this signal, or, for
    "ceiling", drafting exactly what comes true of today's guesses (no controller can know)."""
    if mode == "ceiling":
        return ceiling(prompt, answer, truth, ngram_guesses(prompt, answer, 16))
    return replay(prompt, answer, truth, n_vocab, ngram_policy(cal.cost_curve()), drafter=Signalled(mode))


def replay_table(doctor: Sequence[Path] = ()) -> None:
    stored = json.loads((ROOT / "tests/data/replay_curves.json").read_text())
    curves = {p.stem: json.loads(p.read_text()) for p in doctor} or {c: stored[c] for c in CURVES}
    print("curve, answers, mode: x plain, x lookup γ=4, x lookup γ=8 (geometric means), worst x plain")
    for curve, report in curves.items():
        cal = calibration_from_doctor(report)
        truth = Truth.of(cal)
        for name, path in SETS.items():
            data = json.loads(path.read_text())
            for mode in ("as is", "counted", "resync", "consensus", "copied", "ceiling"):
                logs, worst = [0.0, 0.0, 0.0], math.inf
                for rec in data["answers"].values():
                    prompt, answer = list(rec["prompt"]), list(rec["answer"])
                    ours = _seconds(mode, prompt, answer, truth, data["n_vocab"], cal)
                    ratios = [
                        truth.plain(prompt, answer) / ours,
                        *(replay_lookup(prompt, answer, truth, g) / ours for g in (4, 8)),
                    ]
                    logs = [s + math.log(r) for s, r in zip(logs, ratios, strict=True)]
                    worst = min(worst, ratios[0])
                means = " ".join(f"{math.exp(s / len(data['answers'])):.3f}" for s in logs)
                print(f"{curve:18s} {name:24s} {mode:8s} {means} {worst:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", action="store_true")
    parser.add_argument("--replay", action="store_true")
    parser.add_argument(
        "--doctor", type=Path, action="append", default=[], help="replay on this `localspec doctor --json` curve"
    )
    args = parser.parse_args()
    if args.signal or not args.replay:
        signal_table([rec for path in SETS.values() for rec in json.loads(path.read_text())["answers"].values()])
    if args.replay or not args.signal:
        replay_table(args.doctor)


if __name__ == "__main__":
    main()
