"""Golden replays: the SmolLM2-135M's recorded greedy answers to the bench suite and the wide
set (tests/data/replay_answers.json, benchmarks/record_replay_answers.py) replayed through
the real engine, n-gram drafter and adaptive policy on fixed cost curves of several machines
(tests/data/replay_curves.json, each with its source; some are synthetic and say so), on a
simulated clock (localspec/control/replay.py). No model runs.

Each curve's replay must stay near the oracles (the best fixed γ per answer, and the
ceiling of any draft-length choice) and never lose to plain decoding; GOLDEN pins its
speedup, so a rule that moves no number here earns nothing on these machines.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from localspec.control.factory import ngram_policy
from localspec.control.replay import Score, Truth, calibration_from_doctor, score

DATA = Path(__file__).parent / "data"
ANSWERS: dict[str, Any] = json.loads((DATA / "replay_answers.json").read_text())
CURVES: dict[str, dict[str, Any]] = json.loads((DATA / "replay_curves.json").read_text())

# Speedup over plain decoding of the adaptive policy on every curve, all answers together
# (benchmarks/replay_rules.py prints them, and what each rule adds to them).
GOLDEN: dict[str, float] = {
    "apple-like": 1.146,
    "gpu-h200-llama-3.1-8b-bf16": 1.613,
    "llama-3.1-8b-q4_k_m": 1.058,
    "llama-3.2-1b-q4_k_m": 1.044,
    "llama-3.2-3b-q4_k_m": 1.053,
    "smollm2-135m-q4_1": 1.086,
    "split-rpc-0ms": 1.013,
}

# The bands: at least this share of the best fixed γ chosen per answer (an oracle that knows
# each answer in advance, plain decoding included) and of the ceiling (the best draft length
# at every step); no answer below WORST_ANSWER of plain (a causal policy pays a little to
# learn where nothing can be won), and never below plain over all answers.
ORACLE_SHARE = 0.98
CEILING_SHARE = 0.82
WORST_ANSWER = 0.94


@functools.cache
def replayed(name: str) -> Score:
    cal = calibration_from_doctor(CURVES[name])
    return score(ANSWERS["answers"], Truth.of(cal), ANSWERS["n_vocab"], lambda: ngram_policy(cal.cost_curve()))


def test_every_curve_is_pinned_and_says_where_it_comes_from() -> None:
    assert sorted(GOLDEN) == sorted(CURVES)
    assert all(isinstance(c["synthetic"], bool) and c["source"] for c in CURVES.values())


@pytest.mark.parametrize("name", sorted(CURVES))
def test_the_replay_never_loses_to_plain_decoding(name: str) -> None:
    s = replayed(name)
    assert s.adaptive < s.plain
    assert s.worst >= WORST_ANSWER, f"{name}: one answer at {s.worst:.3f}x plain"


@pytest.mark.parametrize("name", sorted(CURVES))
def test_the_replay_stays_near_the_oracles(name: str) -> None:
    s = replayed(name)
    assert min(s.fixed) / s.adaptive >= ORACLE_SHARE  # the best single fixed γ for all answers
    assert s.best_fixed_per_answer / s.adaptive >= ORACLE_SHARE
    assert s.ceiling / s.adaptive >= CEILING_SHARE


@pytest.mark.parametrize("name", sorted(CURVES))
def test_the_replayed_speedup_is_pinned(name: str) -> None:
    s = replayed(name)
    assert s.speedup(s.adaptive) == pytest.approx(GOLDEN[name], abs=0.0015)
