"""Golden replays of the memory of earlier requests: SmolLM2-135M's recorded greedy answers to
the sessions of benchmarks/prompts_sessions.jsonl (tests/data/session_answers.json,
`benchmarks/memory_replay.py record`) replayed through the real engine, n-gram drafter and
adaptive policy on measured cost curves, on a simulated clock. The memory must never lose to
lookup on the request's own text alone (issue 41: at least 0.98x on every session), must pay
where a request is asked again, and GOLDEN pins what it reaches against llama-lookup's -lcd."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest
from repo_paths import DATA

from localspec.control.factory import ngram_policy
from localspec.control.replay import Truth, calibration_from_doctor, replay, replay_session
from localspec.drafters.memory import NgramMemory
from localspec.drafters.ngram import NgramDrafter
from localspec.tooling.bench import geometric_mean

SESSIONS = json.loads((DATA / "session_answers.json").read_text())
CURVES = json.loads((DATA / "replay_curves.json").read_text())
# The memory against llama-lookup γ=4 with its dynamic cache, geometric mean over the sessions.
GOLDEN = {"smollm2-135m-q4_1": 1.206, "smollm2-135m-f16": 1.055}
# The same when every policy starts from a curve learnt in a busier hour (each pass 1.6 times
# as dear, every size timed): what a runtime loads after a loaded day. Within 0.6 % of
# GOLDEN: a block's price is learnt in single steps, so the level barely moves a choice.
GOLDEN_LEARNT = {"smollm2-135m-q4_1": 1.201, "smollm2-135m-f16": 1.053}


@functools.cache
def sessions(curve: str, level: float | None = None) -> dict[str, dict[str, float]]:
    cal = calibration_from_doctor(CURVES[curve])
    start = None
    if level is not None:
        deep = [t * level for t in cal.deep_verify_seconds] if cal.deep_verify_seconds else None
        busier = [t * level for t in cal.verify_seconds]
        start = replace(cal, verify_seconds=busier, deep_verify_seconds=deep, source="learnt", evidence=[32.0] * 16)
    return {
        name: replay_session(reqs, cal, SESSIONS["n_vocab"], start=start) for name, reqs in SESSIONS["sessions"].items()
    }


@pytest.mark.parametrize("curve", sorted(GOLDEN))
def test_the_memory_never_loses_to_lookup_on_the_requests_own_text(curve: str) -> None:
    for name, s in sessions(curve).items():
        assert s["ngram"] / s["ngram+memory"] >= 0.98, name


@pytest.mark.parametrize("curve", sorted(GOLDEN))
def test_the_memory_against_llama_lookup_with_its_dynamic_cache_is_pinned(curve: str) -> None:
    ratios = [s["lookup γ=4 -lcd"] / s["ngram+memory"] for s in sessions(curve).values()]
    assert geometric_mean(ratios) == pytest.approx(GOLDEN[curve], abs=0.0015)


@pytest.mark.parametrize("curve", sorted(GOLDEN_LEARNT))
def test_a_curve_learnt_in_a_busier_hour_keeps_the_memory_ahead(curve: str) -> None:
    replayed = sessions(curve, 1.6)
    for name, s in replayed.items():
        assert s["ngram"] / s["ngram+memory"] >= 0.98, name
    ratios = [s["lookup γ=4 -lcd"] / s["ngram+memory"] for s in replayed.values()]
    assert geometric_mean(ratios) == pytest.approx(GOLDEN_LEARNT[curve], abs=0.0015)


def test_a_request_asked_again_is_drafted_from_its_first_answer() -> None:
    cal = calibration_from_doctor(CURVES["smollm2-135m-q4_1"])
    truth, n_vocab = Truth.of(cal), SESSIONS["n_vocab"]
    gains = []
    for rec in SESSIONS["sessions"]["sql"]:
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        memory = NgramMemory()
        memory.add(prompt + answer)
        alone = replay(prompt, answer, truth, n_vocab, ngram_policy(cal.cost_curve()))
        again = replay(
            prompt, answer, truth, n_vocab, ngram_policy(cal.cost_curve()), drafter=NgramDrafter(memory=memory)
        )
        gains.append(alone / again)
    assert min(gains) > 1.1
