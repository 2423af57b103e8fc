"""Recorded answers replayed on a measured cost curve twice: with the controller starting from
that curve, and starting from the learnt curve a host's calibration cache holds, as a runtime
on that host starts (a curve learnt in another hour: another level, and the noise of the sizes
it timed seldom). n-gram's speedup over plain decoding, its worst answer, and llama-lookup's
drafter (LookupCache) at γ=4 and γ=8 over ours, all answers together. No model runs.
--losers N: then every answer under N times plain decoding, with each step's trace
(support:drafted/accepted), from each start.

    python benchmarks/learnt_start_replay.py CALIBRATION.json [--answers ANSWERS.json]
        [--curve smollm2-135m-q4_1 | --doctor DOCTOR.json] [--match Q4_1.gguf] [--losers 0.98]

ANSWERS.json: tests/data/replay_answers.json (default) or one written by
record_replay_answers.py; CALIBRATION.json: a $LOCALSPEC_HOME/calibration.json; DOCTOR.json: a
`localspec doctor --refresh --json` report, whose curve replaces --curve's (today's host).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from localspec.control.calibrate import Calibration
from localspec.control.factory import ngram_policy
from localspec.control.replay import Truth, calibration_from_doctor, learnt_calibration, replay, replay_lookup

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def row(answers: dict[str, Any], truth: Truth, start: Calibration) -> str:
    plain = ours = 0.0
    lookup = {4: 0.0, 8: 0.0}
    worst = float("inf")
    for rec in answers["answers"].values():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        base = truth.plain(prompt, answer)
        mine = replay(prompt, answer, truth, answers["n_vocab"], ngram_policy(start.cost_curve()))
        plain, ours, worst = plain + base, ours + mine, min(worst, base / mine)
        for g in lookup:
            lookup[g] += replay_lookup(prompt, answer, truth, g)
    return (
        f"n-gram {plain / ours:.3f}x plain (worst answer {worst:.3f}x), "
        f"vs llama-lookup γ=4 {lookup[4] / ours:.3f}x, γ=8 {lookup[8] / ours:.3f}x"
    )


def losers(answers: dict[str, Any], truth: Truth, start: Calibration, below: float) -> None:
    """Each answer under `below` times plain decoding, and the steps that made it."""
    for name, rec in answers["answers"].items():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        speedup = truth.plain(prompt, answer) / replay(
            prompt, answer, truth, answers["n_vocab"], ngram_policy(start.cost_curve())
        )
        if speedup < below:
            print(f"    {name} ({len(answer)} tokens): {speedup:.3f}x plain")
            replay(prompt, answer, truth, answers["n_vocab"], ngram_policy(start.cost_curve()), trace=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibration", type=Path)
    parser.add_argument("--answers", type=Path, default=DATA / "replay_answers.json")
    parser.add_argument("--curve", default="smollm2-135m-q4_1", help="a curve of tests/data/replay_curves.json")
    parser.add_argument("--doctor", type=Path, help="a `localspec doctor --json` report: its curve is the truth")
    parser.add_argument("--match", default="Q4_1.gguf", help="a part of the learnt entry's key (the model file)")
    parser.add_argument("--losers", type=float, help="trace every answer under this speedup over plain")
    args = parser.parse_args()
    answers = json.loads(args.answers.read_text(encoding="utf-8"))
    if args.doctor:
        report, name = json.loads(args.doctor.read_text(encoding="utf-8")), str(args.doctor)
    else:
        report, name = json.loads((DATA / "replay_curves.json").read_text(encoding="utf-8"))[args.curve], args.curve
    cal = calibration_from_doctor(report)
    truth = Truth.of(cal)
    print(f"{args.answers.name} on the {name} curve")
    print(f"  starting from it:           {row(answers, truth, cal)}")
    learnt = learnt_calibration(args.calibration, args.match)
    print(f"  starting from learnt {args.match}: {row(answers, truth, learnt)}")
    if args.losers:
        for start, label in ((cal, "its own curve"), (learnt, f"learnt {args.match}")):
            print(f"  answers under {args.losers}x plain, starting from {label}:")
            losers(answers, truth, start, args.losers)


if __name__ == "__main__":
    main()
