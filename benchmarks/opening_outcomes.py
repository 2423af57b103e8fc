"""How a request's opening n-gram guess fares: for every golden answer (tests/data/replay_answers.json
only; the held-out answers judge rules and must not tune them) and every support s, the first
guess whose support reaches s, how many tokens it offered and how many of them the recorded
answer kept. The controller opens a request at the first guess its priors price as paying, which
is where a match first grows that long: whether the copy goes on past it is what the opening bets.
Written as benchmarks/results/2026-11-29-opening/opening_outcomes.json, the empirical prior of a
request's opening draft that benchmarks/opening_rules.py prices variants with (issue #58 item 5:
every answer under 0.97x plain on Q4_1 loses on one opening draft the support priors price as
paying). No rule that reads it was kept, so the policy does not.

    python benchmarks/opening_outcomes.py [--answers tests/data/replay_answers.json] [--out PATH]

Deterministic: the drafter reads the recorded text; no model runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from localspec.control.config import DEFAULT
from localspec.core.sampling import SamplingConfig
from localspec.drafters import common_prefix
from localspec.drafters.ngram import NgramDrafter

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "replay_answers.json"
OUT = ROOT / "benchmarks" / "results" / "2026-11-29-opening" / "opening_outcomes.json"


def openings(prompt: list[int], answer: list[int], longest: int) -> dict[int, tuple[int, int, int]]:
    """Per support s, the answer's first guess of support s or more: (its support, offered, kept);
    a guess is cut where the answer ends, as the engine cuts it (a pass holds the pending token)."""
    drafter, found = NgramDrafter(), dict[int, tuple[int, int, int]]()
    drafter.start(prompt)
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    for i in range(len(answer) - 1):
        guess = drafter.propose(prompt + answer[:i], min(longest, len(answer) - 1 - i), cfg, rng)
        offered = list(guess.tokens)
        for s in range(1, guess.support + 1 if offered else 1):
            found.setdefault(s, (guess.support, len(offered), common_prefix(offered, answer[i:])))
    return found


def record(answers: dict[str, Any], longest: int) -> dict[str, Any]:
    by_support: dict[int, list[list[Any]]] = {}
    for name, rec in answers["answers"].items():
        for at, (support, offered, kept) in openings(list(rec["prompt"]), list(rec["answer"]), longest).items():
            by_support.setdefault(at, []).append([name, support, offered, kept])
    return {
        "about": "per support s: each golden answer's first n-gram guess of support s or more, "
        "as [answer, its support, tokens offered, tokens the answer kept]",
        "script": "benchmarks/opening_outcomes.py",
        "answers": answers["model"] + " greedy, tests/data/replay_answers.json",
        "supports": {str(s): by_support[s] for s in sorted(by_support)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=Path, default=GOLDEN)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--longest", type=int, default=DEFAULT.max_draft)
    args = parser.parse_args()
    table = record(json.loads(args.answers.read_text()), args.longest)
    args.out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    for at, rows in table["supports"].items():
        print(f"support {at}: {len(rows)} openings, kept {sorted(r[3] for r in rows)}")


if __name__ == "__main__":
    main()
