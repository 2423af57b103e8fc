"""The replays behind this folder's tables: golden (g) and held-out (h) answers, total speedup
over plain and the worst answer, on two curves, for ControlConfig variants given as
"field=value;field=value" (tuples as Python literals); every answer that moved is listed.

    python benchmarks/results/2026-11-29-regret/sweep.py [VARIANT ...]

CURVES=a,b picks other curves of tests/data/replay_curves.json; a path to a doctor report works too.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from localspec.control.config import DEFAULT, ControlConfig
from localspec.control.factory import ngram_policy
from localspec.control.replay import Truth, calibration_from_doctor, replay

DATA = Path("tests/data")
CURVES: dict[str, Any] = json.loads((DATA / "replay_curves.json").read_text())
NAMES = os.environ.get("CURVES", "smollm2-135m-q4_1,smollm2-135m-f16").split(",")
SETS = {
    "g": json.loads((DATA / "replay_answers.json").read_text()),
    "h": json.loads((DATA / "heldout_answers.json").read_text()),
}
Result = dict[str, tuple[float, dict[str, float]]]


def curve(name: str) -> Any:
    return json.loads(Path(name).read_text()) if name.endswith(".json") else CURVES[name]


def run(job: tuple[str, ControlConfig]) -> Result:
    name, cfg = job
    cal = calibration_from_doctor(curve(name))
    truth, out = Truth.of(cal), {}
    for tag, data in SETS.items():
        plain = ours = 0.0
        per: dict[str, float] = {}
        for answer_name, rec in data["answers"].items():
            prompt, answer = list(rec["prompt"]), list(rec["answer"])
            base = truth.plain(prompt, answer)
            seconds = replay(prompt, answer, truth, data["n_vocab"], ngram_policy(cal.cost_curve(cfg), cfg))
            plain, ours, per[answer_name] = plain + base, ours + seconds, base / seconds
        out[tag] = (plain / ours, per)
    return out


def variant(spec: str) -> ControlConfig:
    fields: dict[str, Any] = {}
    for item in spec.split(";"):
        key, value = item.split("=")
        default = getattr(DEFAULT, key)
        fields[key] = ast.literal_eval(value) if isinstance(default, tuple) else type(default)(ast.literal_eval(value))
    return dataclasses.replace(DEFAULT, **fields)


def main(specs: list[str]) -> None:
    variants = {"base": DEFAULT, **{spec: variant(spec) for spec in specs}}
    jobs = [(c, cfg) for cfg in variants.values() for c in NAMES]
    with Pool(2) as pool:
        results = pool.map(run, jobs)
    base = results[: len(NAMES)]
    for i, name in enumerate(variants):
        mine = results[i * len(NAMES) : (i + 1) * len(NAMES)]
        cells = []
        for label, r in zip(NAMES, mine, strict=True):
            worst = {tag: min(r[tag][1].items(), key=lambda kv: kv[1]) for tag in r}
            cells.append(
                f"{label[-14:]} g {r['g'][0]:.4f} h {r['h'][0]:.4f} "
                f"worst {worst['g'][0]}:{worst['g'][1]:.3f} {worst['h'][0]}:{worst['h'][1]:.3f}"
            )
        print(f"{name:40s} " + " | ".join(cells))
        if i:
            for label, before, after in zip(NAMES, base, mine, strict=True):
                moved = [
                    f"{n}:{before[t][1][n]:.3f}->{after[t][1][n]:.3f}"
                    for t in before
                    for n in before[t][1]
                    if abs(before[t][1][n] - after[t][1][n]) > 0.0005
                ]
                print(f"    {label[-14:]} " + " ".join(moved))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
