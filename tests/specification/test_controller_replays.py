"""Golden replays: the SmolLM2-135M's recorded greedy answers to the bench suite and the wide
set (tests/data/replay_answers.json, benchmarks/record_replay_answers.py) replayed through
the real engine, n-gram drafter and adaptive policy on fixed cost curves of several machines
(tests/data/replay_curves.json, each with its source; some are synthetic and say so), on a
simulated clock (localspec/control/replay.py). No model runs.

The H100's measured curves (tests/data/gpu_curves.json) project each target with its
family's small drafter at a constant acceptance: there the controller must reach the best
fixed γ within 3 % and never lose to plain decoding; GOLDEN_GPU pins what it reaches.

Each curve's replay must stay near the oracles (the best fixed γ per answer, and the
ceiling of any draft-length choice) and never lose to plain decoding; GOLDEN pins its
speedup, so a rule that moves no number here earns nothing on these machines.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import pytest
from repo_paths import DATA

from localspec.control.factory import ngram_policy
from localspec.control.replay import (
    Score,
    Truth,
    calibration_from_doctor,
    constant_acceptance,
    fixed_speedup,
    replay,
    replay_lookup,
    score,
)

ANSWERS: dict[str, Any] = json.loads((DATA / "replay_answers.json").read_text())
CURVES: dict[str, dict[str, Any]] = json.loads((DATA / "replay_curves.json").read_text())

# Speedup over plain decoding of the adaptive policy on every curve, all answers together
# (benchmarks/replay_rules.py prints them, and what each rule adds to them).
GOLDEN: dict[str, float] = {
    "apple-like": 1.142,
    "gpu-h200-llama-3.1-8b-bf16": 1.634,
    "llama-3.1-8b-q4_k_m": 1.055,
    "llama-3.2-1b-q4_k_m": 1.042,
    "llama-3.2-3b-q4_k_m": 1.050,
    "smollm2-135m-f16": 1.215,
    "smollm2-135m-q4_1": 1.083,
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


# The n-gram controller against llama-lookup's own drafter (LookupCache, a fixed draft of up to
# 4 or 8 tokens) replayed on the same curve and answers: total time ratio, lookup over ours
# (issue #41's goal: 1.10 at both lengths on the SmolLM2 Q4_1 and F16 curves).
GOLDEN_LOOKUP: dict[str, tuple[float, float]] = {
    "smollm2-135m-f16": (1.055, 1.133),  # short of 1.10 at 4 tokens (BENCHMARKS.md §2)
    "smollm2-135m-q4_1": (1.222, 1.288),
}


@functools.cache
def lookup_seconds(name: str, n_draft: int) -> float:
    truth = Truth.of(calibration_from_doctor(CURVES[name]))
    answers = ANSWERS["answers"].values()
    return sum(replay_lookup(list(r["prompt"]), list(r["answer"]), truth, n_draft) for r in answers)


@pytest.mark.parametrize("name", sorted(GOLDEN_LOOKUP))
def test_the_replay_against_llama_lookups_drafter_is_pinned(name: str) -> None:
    ours = replayed(name).adaptive
    ratios = tuple(lookup_seconds(name, n) / ours for n in (4, 8))
    assert min(ratios) > 1.0, f"{name}: behind llama-lookup's drafter ({ratios[0]:.3f}x, {ratios[1]:.3f}x)"
    assert ratios == pytest.approx(GOLDEN_LOOKUP[name], abs=0.0015)


# A curve learnt in another hour (a busier one, every pass 1.6 times as dear; a quieter one,
# 0.6 times) is where the next load starts: its level must not move the choices, only its
# shape may. Replayed on the machine's own curve, with every size timed in that hour ("all")
# or only the sizes today's host had timed in its stored Q4_1 entry ("today's"): at least
# LEARNT_SHARE of what the machine's own curve reaches (the single step finds the level within
# a few steps; the blocks follow it until their own passes are timed), and pinned.
TODAYS_EVIDENCE = [32.0, 13.0, 4.0, 1.0, 7.0, 0.0, 4.0, 1.0, 32.0, 1.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0]
LEARNT_SHARE = 0.975
GOLDEN_LEARNT: dict[tuple[str, float, str], float] = {
    ("smollm2-135m-q4_1", 0.6, "all"): 1.081,
    ("smollm2-135m-q4_1", 1.6, "all"): 1.081,
    ("smollm2-135m-q4_1", 0.6, "today's"): 1.078,
    ("smollm2-135m-q4_1", 1.6, "today's"): 1.077,
    ("smollm2-135m-f16", 0.6, "all"): 1.213,
    ("smollm2-135m-f16", 1.6, "all"): 1.213,
    ("smollm2-135m-f16", 0.6, "today's"): 1.191,
    ("smollm2-135m-f16", 1.6, "today's"): 1.190,
}


def learnt_speedup(name: str, level: float, evidence: list[float]) -> float:
    """Speedup over plain decoding, all answers together, of a runtime that starts from the
    machine's curve at `level` times its prices, stored as learnt with this evidence per size."""
    cal = calibration_from_doctor(CURVES[name])
    deep = [t * level for t in cal.deep_verify_seconds] if cal.deep_verify_seconds else None
    start = dataclasses.replace(
        cal,
        verify_seconds=[t * level for t in cal.verify_seconds],
        deep_verify_seconds=deep,
        source="learnt",
        evidence=evidence,
    )
    truth, plain, ours = Truth.of(cal), 0.0, 0.0
    for rec in ANSWERS["answers"].values():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        plain += truth.plain(prompt, answer)
        ours += replay(prompt, answer, truth, ANSWERS["n_vocab"], ngram_policy(start.cost_curve()))
    return plain / ours


@pytest.mark.parametrize(("name", "level", "timed"), sorted(GOLDEN_LEARNT))
def test_a_curve_learnt_in_a_busier_or_a_quieter_hour_chooses_as_the_machines_own(
    name: str, level: float, timed: str
) -> None:
    own = replayed(name).speedup(replayed(name).adaptive)
    reached = learnt_speedup(name, level, [32.0] * 16 if timed == "all" else TODAYS_EVIDENCE)
    assert reached >= LEARNT_SHARE * own, f"{name} learnt at {level}x: {reached:.3f}x against {own:.3f}x"
    assert reached == pytest.approx(GOLDEN_LEARNT[(name, level, timed)], abs=0.0015)


GPU: dict[str, Any] = json.loads((DATA / "gpu_curves.json").read_text())
GPU_CELLS = [(t, k, a) for t in GPU["pairs"] for k in ("bf16", "int8", "int4") for a in (0.6, 0.7, 0.8)]

# The speedup the controller's own choices reach on each H100 cell (benchmarks/gpu_shapes.py
# --project prints the same table beside the best fixed γ).
GOLDEN_GPU: dict[str, float] = {
    "llama-3.1-8b/bf16/0.6": 1.216,
    "llama-3.1-8b/bf16/0.7": 1.358,
    "llama-3.1-8b/bf16/0.8": 1.576,
    "llama-3.1-8b/int8/0.6": 1.390,
    "llama-3.1-8b/int8/0.7": 1.584,
    "llama-3.1-8b/int8/0.8": 1.878,
    "llama-3.1-8b/int4/0.6": 1.054,
    "llama-3.1-8b/int4/0.7": 1.132,
    "llama-3.1-8b/int4/0.8": 1.266,
    "qwen2.5-7b/bf16/0.6": 1.197,
    "qwen2.5-7b/bf16/0.7": 1.343,
    "qwen2.5-7b/bf16/0.8": 1.562,
    "qwen2.5-7b/int8/0.6": 1.534,
    "qwen2.5-7b/int8/0.7": 1.790,
    "qwen2.5-7b/int8/0.8": 2.203,
    "qwen2.5-7b/int4/0.6": 1.105,
    "qwen2.5-7b/int4/0.7": 1.203,
    "qwen2.5-7b/int4/0.8": 1.342,
}


def gpu_cell(target: str, kind: str, alpha: float) -> tuple[float, float]:
    """(best fixed γ's speedup, plain included; the controller's) on one H100 cell."""
    curve = [t / 1e3 for t in GPU["curves"][f"{target}/{kind}"]]
    draft = GPU["curves"][f"{GPU['pairs'][target]}/{kind}"][0] / 1e3
    best = max(fixed_speedup(curve, draft, g, alpha) for g in range(len(curve)))
    return best, constant_acceptance(curve, draft, alpha)[1]


@pytest.mark.parametrize(("target", "kind", "alpha"), GPU_CELLS)
def test_on_the_h100_curves_the_controller_reaches_the_best_fixed_draft_length(
    target: str, kind: str, alpha: float
) -> None:
    best, reached = gpu_cell(target, kind, alpha)
    assert reached >= 1.0
    assert reached >= 0.97 * best, f"{target} {kind} at {alpha}: {reached:.3f}x against {best:.3f}x fixed"
    assert reached == pytest.approx(GOLDEN_GPU[f"{target}/{kind}/{alpha}"], abs=0.005)
