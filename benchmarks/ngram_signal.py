"""Which of the n-gram drafter's own features tell a guess that comes true from one that
misses (#41, "never below plain"): at every position of recorded answers where the drafter's
guess has a support in [LOW, HIGH] (where the Q4_1 curve's opening drafts start), how many of
its first 7 tokens the answer then says, grouped by: how many earlier occurrences match as
far back as the guess's own (ties), whether the guess copies the prompt or the answer so far,
and whether other occurrences matched >= 3 tokens back go on differently within the 7
(continuations that part). No model runs.

    python benchmarks/ngram_signal.py [ANSWERS.json ...] [--low 8] [--high 10]

ANSWERS.json: tests/data/replay_answers.json (default) or one written by record_replay_answers.py.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localspec.core.sampling import SamplingConfig
from localspec.drafters.ngram import CANDIDATES, MAX_SUPPORT, NgramDrafter

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SPAN = 7  # the opening draft's length on the Q4_1 curve


def matches(text: Sequence[int]) -> list[tuple[int, int]]:
    """(position after, support) of the latest CANDIDATES earlier occurrences of the last token."""
    size, found = len(text), [p for p in range(1, len(text)) if text[p - 1] == text[-1]]
    out = []
    for pos in found[-CANDIDATES:]:
        m = 1
        while m < MAX_SUPPORT and pos > m and text[pos - m - 1] == text[size - m - 1]:
            m += 1
        out.append((pos, m))
    return out


def features(text: Sequence[int], guess: Sequence[int], support: int, prompt: int) -> list[str]:
    found = matches(text)
    best = max((p for p, m in found if m == support), default=-1)
    ties = sum(1 for _, m in found if m == support)
    parts = any(text[p : p + SPAN] != list(guess[: len(text) - p]) for p, m in found if p != best and m >= 3)
    return [
        f"ties {'1' if ties <= 1 else '>=2'}",
        f"source {'prompt' if best < prompt else 'answer'}",
        f"earlier continuations part {'yes' if parts else 'no'}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("answers", type=Path, nargs="*", default=[DATA / "replay_answers.json"])
    parser.add_argument("--low", type=int, default=8)
    parser.add_argument("--high", type=int, default=10)
    args = parser.parse_args()
    groups: dict[str, list[int]] = defaultdict(list)
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    for path in args.answers:
        for rec in json.loads(path.read_text(encoding="utf-8"))["answers"].values():
            prompt, answer = list(rec["prompt"]), list(rec["answer"])
            drafter = NgramDrafter()
            drafter.start(prompt)
            for i in range(len(answer) - SPAN):
                text = prompt + answer[:i]
                draft = drafter.propose(text, SPAN, cfg, rng)
                if draft.tokens and args.low <= draft.support <= args.high:
                    came = next((k for k in range(SPAN) if draft.tokens[k] != answer[i + k]), SPAN)
                    for key in ["all", *features(text, draft.tokens, draft.support, len(prompt))]:
                        groups[key].append(came)
    print(f"guesses at support {args.low}-{args.high}: tokens of {SPAN} that came true")
    for key, trues in sorted(groups.items()):
        full, none = sum(c == SPAN for c in trues) / len(trues), sum(c == 0 for c in trues) / len(trues)
        print(f"  {key:34s} n={len(trues):4d}  mean {np.mean(trues):.2f}  all {full:.2f}  none {none:.2f}")


if __name__ == "__main__":
    main()
