"""A request chooses its own speculation and what it reuses of the cache (stream()/generate()'s
speculation= and reuse_prefix=), for itself alone: the runtime's parts are not changed, the
next request decodes as before, and the answer is the same whatever is chosen."""

from __future__ import annotations

import pytest

from localspec.api import Runtime, runtime_for
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend
from localspec.strategies import Speculation

pytestmark = pytest.mark.model

# Text that repeats, so n-gram lookup finds guesses (and drafts) at temperature 0.
LOOPING = "one two three four, one two three four, one two three four, one two"
N = 40


def answer(runtime: Runtime, **choices: object) -> tuple[list[int], int, int, str]:
    """Tokens, tokens drafted, the longest draft and the stats' strategy of a greedy answer
    evaluated from an empty cache (reuse_prefix "none"), so only the speculation differs."""
    done = runtime.generate(LOOPING, max_tokens=N, temperature=0, reuse_prefix="none", **choices)  # type: ignore[arg-type]
    return done.tokens, done.stats.drafted, len(done.stats.drafted_by_position), done.stats.strategy


@pytest.mark.parametrize("strategy", ["ngram", "draft"])
def test_speculation_off_for_one_request_gives_the_runtimes_own_answer(
    target_backend: Backend, q8_drafter_backend: Backend, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = q8_drafter_backend if strategy == "draft" else None
    runtime = runtime_for(target_backend, draft, strategy=strategy, draft_tokens=4, calibrate=False)
    tokens, drafted, _, label = answer(runtime)
    assert drafted > 0 and label == strategy
    asked = []
    propose = runtime.drafter.propose
    monkeypatch.setattr(runtime.drafter, "propose", lambda *args: asked.append(args) or propose(*args))
    off = answer(runtime, speculation={"strategy": "none"})
    assert off == (tokens, 0, 0, "none") and asked == []  # no drafter asked, not even a free lookup
    monkeypatch.undo()
    assert answer(runtime, speculation=Speculation(draft_tokens=0))[:2] == (tokens, 0)
    assert answer(runtime) == (tokens, drafted, 4, strategy)  # the next request drafts as before


def test_a_requests_confidence_floor_reaches_the_draft_model_and_leaves_the_answer(
    target_backend: Backend, q8_drafter_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama-server's speculative.p_min maps onto min_confidence: 0 never ends a draft early,
    # 1 ends every draft after its first token; the greedy answer is the same either way.
    runtime = runtime_for(target_backend, q8_drafter_backend, strategy="draft", draft_tokens=4, calibrate=False)
    tokens, drafted, _, _ = answer(runtime)  # the drafter's own floor
    floors: list[object] = []
    propose = runtime.drafter.propose

    def spied(*args: object, **kwargs: object) -> object:
        floors.append(kwargs.get("min_confidence"))
        return propose(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime.drafter, "propose", spied)
    never = answer(runtime, speculation={"min_confidence": 0})
    every = answer(runtime, speculation=Speculation(min_confidence=1.0))
    assert never[0] == every[0] == tokens
    assert set(floors) == {0.0, 1.0}
    assert every[1] < never[1] and every[1] <= drafted <= never[1]
    monkeypatch.undo()
    assert answer(runtime)[:2] == (tokens, drafted)  # the next request drafts as loaded


def test_a_request_fixes_or_caps_its_own_draft_length(target_backend: Backend) -> None:
    runtime = runtime_for(target_backend, None, strategy="ngram", draft_tokens=4, calibrate=False)
    tokens = answer(runtime)[0]
    two = answer(runtime, speculation={"draft_tokens": 2})
    assert two[0] == tokens and two[1] > 0 and two[2] == 2
    capped = answer(runtime, speculation={"strategy": "auto", "max_draft": 1})
    assert capped[0] == tokens and capped[1] > 0 and capped[2] == 1
    assert answer(runtime, speculation={"strategy": "ngram"})[:3] == answer(runtime)[:3]  # its own: as loaded


def test_a_request_cannot_switch_to_a_drafter_the_runtime_did_not_load(target_backend: Backend) -> None:
    runtime = runtime_for(target_backend, None, strategy="ngram", draft_tokens=4, calibrate=False)
    with pytest.raises(InvalidRequestError, match="cannot switch to 'draft'") as caught:
        runtime.generate(LOOPING, max_tokens=4, speculation={"strategy": "draft"})
    assert caught.value.hint is not None and '"none"' in caught.value.hint
    for wrong, says in (
        ({"draft_tokens": -1}, "draft_tokens must be"),
        ({"max_draft": "8"}, "max_draft must be"),
        ({"gamma": 4}, "unknown speculation field 'gamma'"),
        ({"min_confidence": 1.5}, "min_confidence must be a probability"),
        ({"strategy": "fastest"}, "unknown strategy"),
    ):
        with pytest.raises(InvalidRequestError, match=says):
            runtime.generate(LOOPING, max_tokens=4, speculation=wrong)
    with pytest.raises(InvalidRequestError, match="reuse_prefix must be one of"):
        runtime.generate(LOOPING, max_tokens=4, reuse_prefix="some")  # type: ignore[arg-type]


def test_a_request_chooses_what_it_reuses_of_the_cache(target_backend: Backend) -> None:
    runtime = runtime_for(target_backend, None, strategy="none", calibrate=False)
    prompt_tokens = runtime.generate(LOOPING, max_tokens=8, temperature=0).stats.prompt_tokens
    again = runtime.generate(LOOPING, max_tokens=8, temperature=0, reuse_prefix="any").stats
    assert again.prefill_tokens < prompt_tokens  # the prompt came from the cache
    whole = runtime.generate(LOOPING, max_tokens=8, temperature=0, reuse_prefix="none").stats
    assert whole.prefill_tokens == prompt_tokens and whole.reused_tokens == 0  # evaluated again, all of it
