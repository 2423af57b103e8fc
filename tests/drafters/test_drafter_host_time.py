"""A lookup drafter's host time a step, counted in work rather than seconds (the seconds are
benchmarks/host_time.py --drafters-replay's): a step of n-gram lookup, with or without the memory
of earlier requests, reads a bounded number of tokens and indexes only the tokens that are new,
however long the text and the memory, so a per-step rebuild or rescan of history fails here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import overload

import numpy as np
from repo_paths import DATA

from localspec.core.sampling import SamplingConfig
from localspec.drafters.matching import longest_match
from localspec.drafters.memory import NgramMemory
from localspec.drafters.ngram import CANDIDATES, MAX_SUPPORT, NgramDrafter

GREEDY = SamplingConfig(temperature=0.0)
SESSIONS = json.loads((DATA / "session_answers.json").read_text())["sessions"]
DOCUMENTS = [list(r["prompt"]) + list(r["answer"]) for reqs in SESSIONS.values() for r in reqs]
# One line repeated with a changing value (a list, a CSV): every step's last token occurred at
# dozens of earlier places that each match far back, a full search's worst case.
LINE = [1241, 1002, 476, 7356, 1799, 0, 30, 198]
COPY_LIKE = [t if t else 33 + i % 10 for i in range(60) for t in LINE]
# Tokens a step may read: the key, one comparison per earlier occurrence compared and a few
# full matches, not a full match per occurrence (CANDIDATES * MAX_SUPPORT * 2 = 4096).
STEP_READS = 3 * CANDIDATES + 4 * MAX_SUPPORT


class CountingText(Sequence[int]):
    """Token ids that count how many of them are read (a slice reads each token it holds)."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        got = self.tokens[i]
        self.reads += len(got) if isinstance(got, list) else 1
        return got


def reads_per_step(drafter: NgramDrafter, before: list[int], answer: list[int]) -> list[int]:
    """Each step's tokens read from the text, as the engine steps: one token a step."""
    drafter.start(before)
    reads = []
    for k in range(len(answer)):
        text = CountingText(before + answer[:k])
        drafter.propose(text, 9, GREEDY, np.random.default_rng(0))
        reads.append(text.reads)
    return reads


def test_a_lookup_step_reads_a_bounded_number_of_tokens_however_long_the_text() -> None:
    history = [t for document in DOCUMENTS for t in document]  # about 4,000 tokens
    short = reads_per_step(NgramDrafter(), DOCUMENTS[0], COPY_LIKE)
    long = reads_per_step(NgramDrafter(), history * 5, COPY_LIKE)
    assert max(short) <= STEP_READS and max(long) <= STEP_READS


def test_a_lookup_step_indexes_only_the_new_tokens() -> None:
    drafter = NgramDrafter()
    text = DOCUMENTS[0] * 10
    drafter.start(text[:200])
    for end in range(201, len(text), 3):  # three tokens a step, as a step keeps two drafted and one own
        before = drafter.upkeep
        drafter.propose(text[:end], 9, GREEDY, np.random.default_rng(0))
        assert drafter.upkeep - before <= 3


def test_the_next_turn_of_a_conversation_indexes_only_what_is_new() -> None:
    conversation = [t for document in DOCUMENTS[:20] for t in document]
    turn = conversation + DOCUMENTS[20]
    drafter = NgramDrafter()
    drafter.start(conversation)
    before = drafter.upkeep
    drafter.start(turn)
    assert drafter.upkeep - before == len(DOCUMENTS[20])
    fresh = NgramDrafter()
    fresh.start(turn)
    text = turn + DOCUMENTS[21]
    for end in range(len(turn), len(text)):  # and it guesses as a fresh index does
        rng = np.random.default_rng(0)
        assert drafter.propose(text[:end], 9, GREEDY, rng) == fresh.propose(text[:end], 9, GREEDY, rng)


def memory_of(tokens: int) -> NgramMemory:
    memory = NgramMemory()
    while len(memory) < tokens:
        for document in DOCUMENTS:
            memory.add(document)
    return memory


def test_a_step_of_the_memory_reads_a_bounded_number_of_tokens_however_large_the_memory() -> None:
    steps = {}
    for size in (1_000, 100_000):
        memory = memory_of(size)
        remembered = CountingText(memory._tokens)  # what a recall reads of the memory's own tokens
        memory._tokens = remembered  # type: ignore[assignment]
        reads = reads_per_step(NgramDrafter(memory=memory), DOCUMENTS[3][:60], DOCUMENTS[3][60:])
        steps[size] = max(reads), remembered.reads / len(reads)
    for most, mean_memory_reads in steps.values():
        assert most <= STEP_READS and mean_memory_reads <= STEP_READS


def test_an_occurrence_that_cannot_beat_the_best_costs_one_comparison() -> None:
    # Thirty older occurrences of the last token each match ten tokens back, the newest eleven:
    # each older one is compared at the one token it would need to beat it, not at all ten.
    passage = list(range(20, 29))
    text = CountingText([99, *passage, 2] * 30 + [60, 50, *passage, 2] + [70, 50, *passage, 2])
    found = [i + 1 for i, t in enumerate(text.tokens[:-1]) if t == 2]
    assert longest_match(text, text, found, 1, MAX_SUPPORT) == (found[-1], 11)
    assert text.reads <= 2 * len(found) + 2 * MAX_SUPPORT  # a full match each: 2 * 10 * 30
