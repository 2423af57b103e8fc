"""Every recorded answer replayed on the Q4_1 and F16 curves, one row each: the adaptive
policy's speedup over plain decoding, its mean tokens drafted per drafting pass, and
llama-lookup's drafter at 4 and 8 tokens against ours (issue #58 items 5 and 6). Deterministic:
simulated clock, no model runs.

    python benchmarks/answer_replay.py [--answers tests/data/heldout_answers.json ...] [--trace NAME]
        [--doctor REPORT.json ...]

--controller-time prints instead what the controller (the adaptive policy's choose, observe and
shadow scoring) costs the host a token: thread CPU time of each answer's replay under the policy
less the same replay under a fixed draft length of 0 (the same engine, drafter and clock), the
least of 5 rounds of 5 replays, on the Q4_1 curve.

--doctor replays on the curve a `localspec doctor --json` report measured instead of the two
stored ones (benchmarks/results/avx2-host/doctor_f16.json, say).

--bench RUN.json sets beside each replayed answer what a real `localspec bench --peers --json`
run of the same prompts measured on the same model (its plain answers must be the recorded
ones): n-gram and llama-lookup at 4 and 8 tokens, each over plain decoding, real / replayed,
and their geometric means. The replays price every pass on the curve alone; a real run also
pays each program's own host time a pass, which llama-lookup (C++) barely has.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from localspec.control.factory import ngram_policy
from localspec.control.policy import FixedDraftLength
from localspec.control.replay import Traced, Truth, calibration_from_doctor, replay, replay_lookup

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
CURVES = ("smollm2-135m-q4_1", "smollm2-135m-f16")


def rows(answers: dict[str, Any], report: dict[str, Any], trace: str) -> list[tuple[str, float, float, float, float]]:
    cal = calibration_from_doctor(report)
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


def against_bench(answers: dict[str, Any], report: dict[str, Any], bench: dict[str, Any]) -> None:
    """Real over replayed, per answer and in geometric mean (see --bench)."""
    cal = calibration_from_doctor(report)
    truth, measured = Truth.of(cal), {r["prompt"]: r for r in bench["results"]}
    logs: list[list[float]] = [[], [], [], [], [], []]
    print("answer           n-gram real/replayed   lookup γ4 real/replayed   γ8 real/replayed (x plain)")
    for name, rec in answers["answers"].items():
        row = measured.get(name)
        if row is None:  # a prompt the run did not ask
            continue
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        plain = truth.plain(prompt, answer)
        replayed = [
            plain / replay(prompt, answer, truth, answers["n_vocab"], ngram_policy(cal.cost_curve())),
            *(plain / replay_lookup(prompt, answer, truth, n) for n in (4, 8)),
        ]
        real = [row["speedup"], *(row["peers"][f"llama-lookup (γ={n})"] / row["plain_tokens_per_s"] for n in (4, 8))]
        for k, (a, b) in enumerate(zip(real, replayed, strict=True)):
            logs[2 * k].append(math.log(a))
            logs[2 * k + 1].append(math.log(b))
        cells = "   ".join(f"{a:5.2f} / {b:5.2f}" for a, b in zip(real, replayed, strict=True))
        print(f"{name:16s} {cells}{' (a peer answered another text)' if row['other_answers'] else ''}")
    means = [math.exp(sum(v) / len(v)) for v in logs]
    print("geometric mean   " + "   ".join(f"{means[k]:5.2f} / {means[k + 1]:5.2f}" for k in (0, 2, 4)))
    print(
        f"n-gram over lookup γ4, γ8: real {means[0] / means[2]:.3f}, {means[0] / means[4]:.3f}; "
        f"replayed {means[1] / means[3]:.3f}, {means[1] / means[5]:.3f}"
    )


def controller_time(answers: dict[str, Any], report: dict[str, Any]) -> None:
    cal = calibration_from_doctor(report)
    truth = Truth.of(cal)
    for name, rec in answers["answers"].items():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        cpu = {}
        for label, policy in (
            ("fixed 0", lambda: FixedDraftLength(0)),
            ("adaptive", lambda: ngram_policy(cal.cost_curve())),
        ):
            rounds = []
            for _ in range(5):
                start = time.thread_time_ns()
                for _ in range(5):
                    replay(prompt, answer, truth, answers["n_vocab"], policy())
                rounds.append((time.thread_time_ns() - start) / 5 / len(answer) / 1e3)
            cpu[label] = min(rounds)
        print(f"{name:16s} {cpu['fixed 0']:6.1f} {cpu['adaptive']:6.1f} {cpu['adaptive'] - cpu['fixed 0']:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=Path, action="append", default=[])
    parser.add_argument("--doctor", type=Path, action="append", default=[], help="a `localspec doctor --json` report")
    parser.add_argument("--controller-time", action="store_true", help="the controller's host time a token")
    parser.add_argument("--trace", default="", help="print this answer's steps (support:drafted/accepted)")
    parser.add_argument("--bench", type=Path, help="a `localspec bench --peers --json` run of the same prompts")
    args = parser.parse_args()
    stored = json.loads((DATA / "replay_curves.json").read_text())
    curves = {str(p): json.loads(p.read_text()) for p in args.doctor} or {c: stored[c] for c in CURVES}
    for path in args.answers or [DATA / "replay_answers.json", DATA / "heldout_answers.json"]:
        answers = json.loads(path.read_text())
        if args.controller_time:
            print(f"## {path.name}: thread CPU us a token, fixed 0, adaptive, the controller's share")
            controller_time(answers, stored[CURVES[0]])
            continue
        for curve, report in curves.items():
            if args.bench:
                print(f"## {path.name} on {curve} against {args.bench.name}")
                against_bench(answers, report, json.loads(args.bench.read_text()))
                continue
            print(f"## {path.name} on {curve}: answer, x plain, mean drafted, lookup γ4 / ours, γ8 / ours")
            table = rows(answers, report, args.trace)
            for name, speedup, mean, g4, g8 in table:
                print(f"{name:16s} {speedup:6.3f} {mean:5.2f} {g4:6.3f} {g8:6.3f}")
            print(f"worst {min(r[1] for r in table):.3f}")


if __name__ == "__main__":
    main()
