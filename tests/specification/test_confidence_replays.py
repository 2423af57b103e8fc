"""The target's own confidence along the recorded answers (tests/data/answer_confidence.json,
recorded by benchmarks/record_confidence.py: the top-1 probability and top-1/top-2 margin of the
row of SmolLM2-135M Q4_1 that chose every answer token), and what it says about the drafts that
hold answers under 0.97x plain on the Q4_1 curve (issue 58 item 5).

A step that decides the next draft holds the row that chose its pending token; the drafts that
lose come right after rows the target is sure of, so no rule that reads the target's confidence
there can hold them back without holding back the sure rows' guesses, which come true most
often (benchmarks/confidence_rules.py replays those rules; results/2026-11-29-confidence).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from repo_paths import DATA

from localspec.control.factory import ngram_policy
from localspec.control.replay import Traced, Truth, calibration_from_doctor, replay

CONFIDENCE: dict[str, Any] = json.loads((DATA / "answer_confidence.json").read_text())["answers"]
FILES = ("replay_answers.json", "heldout_answers.json")
ANSWERS: dict[str, dict[str, Any]] = {f: json.loads((DATA / f).read_text()) for f in FILES}
Q4_1: dict[str, Any] = json.loads((DATA / "replay_curves.json").read_text())["smollm2-135m-q4_1"]


@pytest.mark.parametrize("file", FILES)
def test_every_answer_token_has_the_confidence_of_the_row_that_chose_it(file: str) -> None:
    answers, confidence = ANSWERS[file]["answers"], CONFIDENCE[file]
    assert sorted(confidence) == sorted(answers)
    for name, rec in answers.items():
        rows = confidence[name]
        assert len(rows["p1"]) == len(rows["margin"]) == len(rec["answer"]), name
        # A greedy token is its row's top-1, so its probability is at least the margin over the runner-up.
        assert all(0.0 <= m <= p <= 1.0 for p, m in zip(rows["p1"], rows["margin"], strict=True)), name


@pytest.mark.parametrize(
    ("file", "name"), [("replay_answers.json", "summary_news"), ("heldout_answers.json", "html_list")]
)
def test_the_losing_opening_draft_follows_a_row_the_target_is_sure_of(file: str, name: str) -> None:
    rec, cal = ANSWERS[file]["answers"][name], calibration_from_doctor(Q4_1)
    prompt, answer = list(rec["prompt"]), list(rec["answer"])
    traced = Traced(ngram_policy(cal.cost_curve()))
    truth = Truth.of(cal)
    assert truth.plain(prompt, answer) / replay(prompt, answer, truth, ANSWERS[file]["n_vocab"], traced) < 0.97
    position = 0
    for _, gamma, accepted in traced.steps:
        if gamma > 0:
            break
        position += accepted + 1
    assert (gamma, accepted) in {(7, 0), (7, 1)}  # the opening draft misses
    # The row that chose the pending token is near-sure: a rule that held this draft back
    # would hold back every guess after such a row (about 72 % of their first tokens come true).
    assert CONFIDENCE[file][name]["p1"][position - 1] >= 0.95
