"""Every recorded answer replayed on the Q4_1 and F16 curves, one row each: the adaptive
policy's speedup over plain decoding, its mean tokens drafted per drafting pass, and
llama-lookup's drafter at 4 and 8 tokens against ours (issue #58 items 5 and 6). Deterministic:
simulated clock, no model runs.

    python benchmarks/answer_replay.py [--answers tests/data/heldout_answers.json ...] [--trace NAME]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from localspec.control.factory import ngram_policy
from localspec.control.replay import Traced, Truth, calibration_from_doctor, replay, replay_lookup

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
CURVES = ("smollm2-135m-q4_1", "smollm2-135m-f16")


def rows(answers: dict[str, Any], curve: str, trace: str) -> list[tuple[str, float, float, float, float]]:
    cal = calibration_from_doctor(json.loads((DATA / "replay_curves.json").read_text())[curve])
    truth, out = Truth.of(cal), []
    for name, rec in answers["answers"].items():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        plain = truth.plain(prompt, answer)
        traced = Traced(ngram_policy(cal.cost_curve()))
        ours = replay(prompt, answer, truth, answers["n_vocab"], traced, trace=name == trace)
        drafts = [g for _, g, _ in traced.steps if g > 0]
        mean = sum(drafts) / len(drafts) if drafts else 0.0
        lookups = [replay_lookup(prompt, answer, truth, n) / ours for n in (4, 8)]
        out.append((name, plain / ours, mean, lookups[0], lookups[1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=Path, action="append", default=[])
    parser.add_argument("--trace", default="", help="print this answer's steps (support:drafted/accepted)")
    args = parser.parse_args()
    for path in args.answers or [DATA / "replay_answers.json", DATA / "heldout_answers.json"]:
        answers = json.loads(path.read_text())
        for curve in CURVES:
            print(f"## {path.name} on {curve}: answer, x plain, mean drafted, lookup γ4 / ours, γ8 / ours")
            table = rows(answers, curve, args.trace)
            for name, speedup, mean, g4, g8 in table:
                print(f"{name:16s} {speedup:6.3f} {mean:5.2f} {g4:6.3f} {g8:6.3f}")
            print(f"worst {min(r[1] for r in table):.3f}")


if __name__ == "__main__":
    main()
