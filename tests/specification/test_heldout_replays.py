"""Held-out replays: answers to prompts written after the controller's rules were tuned
(benchmarks/prompts_heldout.jsonl: a Python refactor, SQL renames, story openings, haiku, list,
CSV and HTML continuations; SmolLM2-135M Q4_1, greedy, 160 tokens, recorded by
benchmarks/record_replay_answers.py --sets into tests/data/heldout_answers.json), replayed as the
golden answers are (tests/specification/test_controller_replays.py) on the Q4_1 and F16 curves. A rule tuned on
the golden answers must hold here too: the totals, the worst answer and the ratio to
llama-lookup's drafter are pinned (benchmarks/answer_replay.py prints every answer).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from repo_paths import DATA

from localspec.control.factory import ngram_policy
from localspec.control.replay import Score, Truth, calibration_from_doctor, replay_lookup, score

ANSWERS: dict[str, Any] = json.loads((DATA / "heldout_answers.json").read_text())
CURVES: dict[str, dict[str, Any]] = json.loads((DATA / "replay_curves.json").read_text())

# Per curve: speedup over plain decoding, all answers together; the worst single answer (issue
# 58's goal is 0.97: on Q4_1 html_list's one opening draft of 7 tokens that misses holds it at
# 0.962); llama-lookup's drafter at 4 and 8 tokens, its time over ours.
GOLDEN_HELDOUT: dict[str, tuple[float, float, float, float]] = {
    "smollm2-135m-q4_1": (1.113, 0.962, 1.192, 1.225),
    "smollm2-135m-f16": (1.241, 0.991, 1.036, 1.090),
}


@functools.cache
def replayed(name: str) -> tuple[Score, float, float]:
    cal = calibration_from_doctor(CURVES[name])
    truth = Truth.of(cal)
    s = score(ANSWERS["answers"], truth, ANSWERS["n_vocab"], lambda: ngram_policy(cal.cost_curve()))
    answers = ANSWERS["answers"].values()
    lookup = [sum(replay_lookup(list(r["prompt"]), list(r["answer"]), truth, n) for r in answers) for n in (4, 8)]
    return s, lookup[0] / s.adaptive, lookup[1] / s.adaptive


def test_the_heldout_answers_are_the_models_own_greedy_answers() -> None:
    assert ANSWERS["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(ANSWERS["answers"]) == 16
    assert all(0 < len(r["answer"]) <= ANSWERS["tokens"] for r in ANSWERS["answers"].values())


@pytest.mark.parametrize("name", sorted(GOLDEN_HELDOUT))
def test_the_heldout_replay_never_loses_to_plain_decoding_in_total(name: str) -> None:
    s, _, _ = replayed(name)
    assert s.adaptive < s.plain
    assert s.worst >= 0.96, f"{name}: one answer at {s.worst:.3f}x plain"


@pytest.mark.parametrize("name", sorted(GOLDEN_HELDOUT))
def test_the_heldout_replay_is_pinned(name: str) -> None:
    s, lookup4, lookup8 = replayed(name)
    reached = (s.speedup(s.adaptive), s.worst, lookup4, lookup8)
    assert min(lookup4, lookup8) > 1.0, f"{name}: behind llama-lookup's drafter ({lookup4:.3f}x, {lookup8:.3f}x)"
    assert reached == pytest.approx(GOLDEN_HELDOUT[name], abs=0.0015)
