"""The replays time llama-lookup by a simulation of its loop (localspec.control.replay.lookup_passes):
every verdict they give against lookup holds only as far as the simulation makes the passes
the program makes. llama.cpp's own llama-lookup, run on the recorded answers
(benchmarks/lookup_fidelity.py --out), printed its counts into tests/data/lookup_counts.json;
the simulation must make its passes there, answer by answer within a few (llama.cpp breaks a
tie between equally counted followers in its hash map's order, the simulation in the order it
met them), and in total within 1 %."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localspec.control.replay import lookup_timed_passes

DATA = Path(__file__).resolve().parent.parent / "data"
COUNTS: dict[str, Any] = json.loads((DATA / "lookup_counts.json").read_text())
PER_ANSWER = 3  # passes an answer's simulation may differ by
IN_TOTAL = 0.01


CASES = [(name, n_draft) for name in sorted(COUNTS) for n_draft in (4, 8)]


@pytest.mark.parametrize(("answers", "n_draft"), CASES)
def test_the_simulated_lookup_makes_llama_lookups_passes(answers: str, n_draft: int) -> None:
    recorded = json.loads((DATA / answers).read_text())
    entry = COUNTS[answers]
    assert entry["model"] == recorded["model"]  # llama-lookup ran on the model that gave the answers
    real_total = sim_total = 0
    off: list[str] = []
    for name, counts in entry["counts"].items():
        rec = recorded["answers"][name]
        answer = list(rec["answer"])
        real = counts[str(n_draft)][2]
        sim = len(lookup_timed_passes(list(rec["prompt"]), answer, n_draft, len(answer) < recorded["tokens"]))
        real_total, sim_total = real_total + real, sim_total + sim
        if abs(sim - real) > PER_ANSWER:
            off.append(f"{name}: {sim} simulated, {real} by llama-lookup")
    assert len(entry["counts"]) >= 10, "too few answers compared to pin anything"
    assert not off, f"γ={n_draft}: " + "; ".join(off)
    assert abs(sim_total - real_total) <= IN_TOTAL * real_total, (sim_total, real_total)
