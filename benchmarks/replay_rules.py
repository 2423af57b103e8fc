"""Which rule of the draft-length controller earns what: the golden replays
(tests/specification/test_controller_replays.py: recorded SmolLM2 answers, fixed cost curves, simulated
clock) with each rule switched off in turn, as total speedup over plain decoding.

    python benchmarks/replay_rules.py [--curves NAME,NAME] [--doctor REPORT.json ...] [--today]

--doctor adds the curve a `localspec doctor --json` report measured (a GPU's, say) as a column
(alone, unless --curves names others too); --today replays only the rules as they are.

Besides the curves as measured (the policy starts from the truth), two starts on the
SmolLM2 curve where the learning rules matter: "stale" (a curve learnt on a busy machine,
blocks priced 3x too dear, trusted on 32 passes each) and "prior" (the roofline prior of
that host, learning from the passes; also on the split target, whose runtime starts there).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from localspec.control.calibrate import Calibration
from localspec.control.config import DEFAULT, ControlConfig
from localspec.control.costs import CostCurve
from localspec.control.factory import ngram_policy
from localspec.control.replay import Truth, calibration_from_doctor, score

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

RULES: dict[str, ControlConfig] = {
    "all rules (today)": DEFAULT,
    "no margin (ngram_margin 0)": replace(DEFAULT, ngram_margin=0.0),
    "symmetric EMA (miss weight = hit weight)": replace(DEFAULT, weight_miss=DEFAULT.weight_hit),
    "no relax toward priors": replace(DEFAULT, relax=0.0),
    "one support level (no support chain)": replace(
        DEFAULT, support_edges=(1,), support_priors=(0.6,), sampled_support_priors=(0.5,)
    ),
    "no probe (probe_after never)": replace(DEFAULT, probe_after=10**9),
    "no re-pricing (_rebase, stale_shape 0)": replace(DEFAULT, stale_shape=0.0),
    "no drift scale (drift_weight 0)": replace(DEFAULT, drift_weight=0.0),
    "no wait for a likely first block (first_block_alpha 0)": replace(DEFAULT, first_block_alpha=0.0),
}

# The roofline prior of the AMD 2-core host for SmolLM2-135M Q4_1 (`localspec doctor --json`,
# benchmarks/results/doctor_q4_1.json "predicted_ms").
PRIOR_MS = [3.09, 3.09, 4.32, 5.76, 7.20, 8.64, 10.08, 11.52, 12.96, 14.40, 15.84, 17.28, 18.72, 20.16, 21.60, 23.04]


def starts(cal: Calibration, name: str) -> dict[str, Callable[[ControlConfig], CostCurve]]:
    out: dict[str, Callable[[ControlConfig], CostCurve]] = {"measured": lambda cfg: cal.cost_curve(cfg)}
    if name.startswith(("smollm2", "split")):

        def stale(cfg: ControlConfig) -> CostCurve:
            busy = [cal.verify_seconds[0]] + [t * 3.0 for t in cal.verify_seconds[1:]]
            return CostCurve(busy, learning=True, evidence=[32.0] * len(busy), config=cfg)

        def prior(cfg: ControlConfig) -> CostCurve:
            shallow = [t / 1e3 for t in PRIOR_MS]
            deep = [t * (cfg.prior_deep + cfg.prior_deep_per_token * k) for k, t in enumerate(shallow)]
            return CostCurve(shallow, deep_seconds=deep, learning=True, config=cfg)

        if name.startswith("smollm2"):
            out["stale"] = stale
        out["prior"] = prior  # the split target's runtime starts from the same model's prior
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curves", help="comma-separated names from tests/data/replay_curves.json")
    parser.add_argument("--doctor", type=Path, action="append", default=[], help="a `localspec doctor --json` report")
    parser.add_argument("--today", action="store_true", help="only the rules as they are, no rule switched off")
    args = parser.parse_args()
    answers: dict[str, Any] = json.loads((DATA / "replay_answers.json").read_text())
    curves: dict[str, dict[str, Any]] = json.loads((DATA / "replay_curves.json").read_text())
    names = args.curves.split(",") if args.curves else ([] if args.doctor else sorted(curves))
    columns: list[tuple[str, Truth, Callable[[ControlConfig], CostCurve]]] = []
    for name in names:
        cal = calibration_from_doctor(curves[name])
        for start, make in starts(cal, name).items():
            columns.append((name if start == "measured" else f"{name} ({start})", Truth.of(cal), make))
    for report in args.doctor:
        measured = calibration_from_doctor(json.loads(report.read_text()))
        columns.append((report.stem, Truth.of(measured), lambda cfg, c=measured: c.cost_curve(cfg)))
    print(f"| rule switched off | {' | '.join(c[0] for c in columns)} |")
    print(f"|---|{'---|' * len(columns)}")
    oracle: list[str] = []
    for rule, cfg in list(RULES.items())[: 1 if args.today else None]:
        cells = []
        for _, truth, make in columns:
            s = score(answers["answers"], truth, answers["n_vocab"], lambda m=make, c=cfg: ngram_policy(m(c), c))
            cells.append(f"{s.speedup(s.adaptive):.3f}x ({s.worst:.2f})")
            if rule == "all rules (today)":
                oracle.append(
                    f"best fixed γ {s.speedup(min(s.fixed)):.3f}x (γ={s.fixed.index(min(s.fixed)) + 1}), "
                    f"per answer {s.speedup(s.best_fixed_per_answer):.3f}x, ceiling {s.speedup(s.ceiling):.3f}x, "
                    f"worst answer {s.worst:.3f}x"
                )
        print(f"| {rule} | {' | '.join(cells)} |", flush=True)
    for (name, _, _), line in zip(columns, oracle, strict=True):
        print(f"{name}: {line}")


if __name__ == "__main__":
    main()
