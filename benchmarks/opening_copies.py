"""An answer that copies a passage from its first tokens on (a list continued, a table renamed):
how often its first short-match n-gram guess comes true, and what vouching for that guess as a
long match would earn (issue #58 items 5 and 6: numbers_list, an 11-token copied answer, where
llama-lookup's long first drafts win). Deterministic: simulated clock, no model runs.

    python benchmarks/opening_copies.py [--doctor REPORT.json ...] [--support N ...]

First, per support level 1-4, the guesses of the golden and held-out answers: "copying" where
the match spans every answer token so far (2 or more of them), "first" at the answer's first
token, "later" elsewhere; how often the guess's first token came true, and the tokens kept.

Then the rule replayed: the first such "copying" guess of a request, of support 3 or more, is
reported with support N (default 8, 16 and 32) instead of its own. Per curve (the stored ones, and
any `localspec doctor --json` report given) and answer set: total time over plain decoding with
the rule off and on, the worst answer, and the answer that lost most.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localspec.control.factory import ngram_policy
from localspec.control.policy import support_level
from localspec.control.replay import Truth, calibration_from_doctor, replay
from localspec.core.drafting import Draft
from localspec.core.sampling import SamplingConfig
from localspec.drafters import common_prefix
from localspec.drafters.ngram import NgramDrafter

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SETS = {"golden": "replay_answers.json", "held-out": "heldout_answers.json", "held-out F16": "heldout_answers_f16.json"}
AT, LEAST = 2, 3  # answer tokens copied, and the shortest match, before a guess counts as copying


class OpeningVouched(NgramDrafter):
    """The n-gram drafter reporting its first copying guess of a request with support `vouched`."""

    def __init__(self, vouched: int) -> None:
        super().__init__()
        self.vouched, self.answer_from, self.opened = vouched, 0, False

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        super().start(context, warm)
        self.answer_from, self.opened = len(context), False

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        draft = super().propose(context, n, cfg, rng)
        at = len(context) - self.answer_from
        copying = at >= AT and draft.support >= max(at, LEAST)
        if self.opened or not copying or draft.support >= self.vouched:
            return draft
        self.opened = True
        return Draft(tokens=draft.tokens, support=self.vouched, branches=draft.branches)


def guess_table() -> None:
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    print("answers, support level, kind: guesses, first token right, mean tokens kept")
    for set_name, file in SETS.items():
        seen: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for rec in json.loads((DATA / file).read_text())["answers"].values():
            prompt, answer = list(rec["prompt"]), list(rec["answer"])
            drafter, text = NgramDrafter(), prompt + answer
            drafter.start(prompt)
            for i in range(len(answer) - 1):
                guess = drafter.propose(text[: len(prompt) + i], 16, cfg, rng)
                level = support_level(guess.support)
                if not guess.tokens or level > 4:
                    continue
                kind = "copying" if i >= AT and guess.support >= i else "first" if i == 0 else "later"
                kept = common_prefix(guess.tokens, answer[i:])
                row = seen[(level, kind)]
                row[0], row[1], row[2] = row[0] + 1, row[1] + (kept > 0), row[2] + kept
        for (level, kind), (n, right, kept) in sorted(seen.items()):
            print(f"{set_name:13s} {level} {kind:8s} {n:5d} {right / n:5.2f} {kept / n:6.2f}")


def replay_table(curves: dict[str, dict[str, Any]], supports: list[int]) -> None:
    print("\ncurve, answers, vouched support: total x plain off -> on, worst answer off -> on, most lost")
    for curve, report in curves.items():
        cal = calibration_from_doctor(report)
        truth = Truth.of(cal)
        for set_name, file in SETS.items():
            data = json.loads((DATA / file).read_text())
            runs = {}
            for vouched in (0, *supports):
                plain = ours = 0.0
                per: dict[str, float] = {}
                for name, rec in data["answers"].items():
                    prompt, answer = list(rec["prompt"]), list(rec["answer"])
                    drafter = OpeningVouched(vouched) if vouched else None
                    seconds = replay(
                        prompt, answer, truth, data["n_vocab"], ngram_policy(cal.cost_curve()), drafter=drafter
                    )
                    plain, ours = plain + truth.plain(prompt, answer), ours + seconds
                    per[name] = truth.plain(prompt, answer) / seconds
                runs[vouched] = (plain / ours, per)
            total, per = runs[0]
            for vouched in supports:
                on, moved = runs[vouched]
                lost, who = min((moved[k] - per[k], k) for k in per)
                print(
                    f"{curve:28s} {set_name:13s} {vouched:3d}  {total:.4f} -> {on:.4f}  "
                    f"{min(per.values()):.3f} -> {min(moved.values()):.3f}  {who} {lost:+.3f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doctor", type=Path, action="append", default=[], help="also this doctor report's curve")
    parser.add_argument("--support", type=int, action="append", default=[], help="the vouched support (repeatable)")
    args = parser.parse_args()
    curves = json.loads((DATA / "replay_curves.json").read_text()) | {
        p.stem: json.loads(p.read_text()) for p in args.doctor
    }
    guess_table()
    replay_table(curves, args.support or [8, 16, 32])


if __name__ == "__main__":
    main()
