"""The memory of earlier requests that n-gram lookup searches beside the request's own text."""

from __future__ import annotations

import numpy as np

from localspec.core.sampling import SamplingConfig
from localspec.drafters.memory import KEY, NgramMemory
from localspec.drafters.ngram import REPEAT, NgramDrafter
from localspec.testing.tui_support import reference

GREEDY = SamplingConfig(temperature=0.0)


def remembered(*documents: list[int], capacity: int = 1000) -> NgramMemory:
    memory = NgramMemory(capacity)
    for document in documents:
        memory.add(document)
    return memory


def test_a_passage_of_an_earlier_request_is_recalled_with_its_match_length() -> None:
    memory = remembered([1, 2, 3, 4, 5, 6, 7, 8])
    draft = memory.recall([9, 2, 3, 4, 5], 3, 32)
    assert draft.tokens == [6, 7, 8] and draft.support == 1  # the match beyond the KEY every recall has


def test_a_match_shorter_than_the_key_recalls_nothing() -> None:
    assert remembered([1, 2, 3, 4, 5, 6]).recall([9, 9, 3, 4, 5], 2, 32).tokens == []


def test_the_passage_matching_furthest_back_is_recalled() -> None:
    memory = remembered([7, 1, 2, 3, 4, 10, 11], [8, 7, 1, 2, 3, 4, 20, 21], [1, 2, 3, 4, 30])
    draft = memory.recall([8, 7, 1, 2, 3, 4], 2, 32)
    assert draft.tokens == [20, 21] and draft.support == 6 - KEY + 1


def test_a_recall_stops_at_the_end_of_its_document() -> None:
    memory = remembered([1, 2, 3, 4, 5], [6, 7, 8, 9])
    assert memory.recall([1, 2, 3, 4], 4, 32).tokens == [5]


def test_the_next_turn_of_a_conversation_adds_only_what_is_new() -> None:
    memory = remembered([1, 2, 3, 4, 5])
    memory.add([1, 2, 3, 4, 5, 6, 7, 8])
    assert len(memory) == 8  # one document, extended
    assert memory.recall([3, 4, 5, 6], 2, 32).tokens == [7, 8]  # matches across the join
    memory.add([1, 2, 3, 4, 5, 6, 7, 8])
    assert len(memory) == 8  # the same request again adds nothing


def test_past_its_capacity_the_oldest_half_is_forgotten() -> None:
    memory = remembered(*([100 + d, 1, 2, 3, 4, 50 + d] for d in range(10)), capacity=40)
    assert len(memory) <= 40
    assert memory.recall([100, 1, 2, 3, 4], 1, 32).support == 1  # the oldest's own start is gone
    assert memory.recall([109, 1, 2, 3, 4], 1, 32).tokens == [59]


def guessed(drafter: NgramDrafter, context: list[int], n: int) -> list[int]:
    drafter.start(context)
    return drafter.propose(context, n, GREEDY, np.random.default_rng(0)).tokens


def test_the_memory_guesses_where_the_requests_own_text_has_no_match() -> None:
    drafter = NgramDrafter(memory=remembered([5, 6, 1, 2, 3, 4, 40, 41, 42]))
    assert guessed(drafter, [7, 5, 6, 1, 2, 3, 4], 3) == [40, 41, 42]  # nothing of its own
    # Its own text matches 1 back, the memory 6: an answer of the same shape, whose values
    # are the request's own (benchmarks/memory_replay.py: outbidding it lost to lookup alone).
    assert guessed(drafter, [8, 8, 4, 77, 5, 6, 1, 2, 3, 4], 2) == [77, 5]


def test_a_remembered_passage_repeated_at_length_outbids_the_requests_own_text() -> None:
    passage = list(range(100, 100 + REPEAT))
    memory = remembered([*passage, 40, 41])
    own = [9, passage[-1], 8, *passage]  # its own text matches 1 back, the memory REPEAT back
    assert guessed(NgramDrafter(memory=memory), own, 2) == [40, 41]
    short = remembered([*passage[1:], 40, 41])  # one token short of a repeat
    assert guessed(NgramDrafter(memory=short), own, 2) == [8, 100]


def test_a_request_asked_again_is_drafted_from_the_first_answer_and_says_the_same() -> None:
    forgetful = reference(strategy="ngram", draft_tokens=4)
    runtime = reference(strategy="ngram", draft_tokens=4, memory=NgramMemory())
    prompt = "tell me about the weather"
    first = runtime.generate(prompt, max_tokens=40, temperature=0)
    again = runtime.generate(prompt, max_tokens=40, temperature=0)
    alone = forgetful.generate(prompt, max_tokens=40, temperature=0)
    assert first.tokens == again.tokens == alone.tokens
    assert again.stats.accepted > alone.stats.accepted
    assert again.stats.accepted >= len(again.tokens) // 2


def test_remembered_conversations_are_searched() -> None:
    runtime = reference(strategy="ngram", draft_tokens=4, memory=NgramMemory())
    messages = [{"role": "user", "content": "hello there"}]
    answer = runtime.generate(messages=messages, max_tokens=30, temperature=0)
    fresh = reference(strategy="ngram", draft_tokens=4, memory=NgramMemory())
    fresh.remember(messages=[*messages, {"role": "assistant", "content": answer.text}])
    again = fresh.generate(messages=messages, max_tokens=30, temperature=0)
    assert again.tokens == answer.tokens
    assert again.stats.accepted > answer.stats.accepted


def test_load_keeps_no_memory_when_asked_not_to() -> None:
    from localspec.api import load

    assert load("reference", backend="reference", memory=False).memory is None
    assert load("reference", backend="reference").memory is not None
