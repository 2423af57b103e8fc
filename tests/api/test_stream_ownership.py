"""Who holds a Runtime: an explicit Stream with close(), a `with` block and one lock, no
garbage collector (issue 31); every stream ends with one Finished, however it ends (issue 56).
Reference backend: only the ownership is under test."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from backends.reference import ReferenceBackend
from localspec.api import Finished, Prompt, Runtime, Stream, TextDelta, runtime_for
from localspec.core.errors import ContextFullError, InvalidRequestError

GREEDY: dict[str, Any] = {"temperature": 0}
BOUND_SECONDS = 60  # a bound, not a timing: a working runtime answers in well under a second
CHAT = [{"role": "user", "content": "Name three rivers."}]


def reference_runtime(n_ctx: int = 512) -> Runtime:
    return runtime_for(ReferenceBackend(seed=3, n_ctx=n_ctx), None, strategy="none", calibrate=False)


def answer_from_another_thread(rt: Runtime) -> list[str]:
    """Ask from a second thread; the list holds the answer once it came."""
    answers: list[str] = []
    thread = threading.Thread(target=lambda: answers.append(rt.generate("Hello", max_tokens=4, **GREEDY).text))
    thread.start()
    thread.join(BOUND_SECONDS)
    assert not thread.is_alive(), "the second thread still waits for the runtime"
    return answers


def test_close_releases_a_stream_its_caller_still_holds() -> None:
    rt = reference_runtime()
    expected = reference_runtime().generate("Hello", max_tokens=4, **GREEDY).text
    gc.disable()  # the release must not come from the collector
    try:
        stream = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
        assert isinstance(stream, Stream) and isinstance(next(stream), TextDelta)
        stream.close()
        answers = answer_from_another_thread(rt)
        stream.close()  # twice is harmless
    finally:
        gc.enable()

    assert answers == [expected]
    last = next(stream)
    assert isinstance(last, Finished) and last.finish_reason == "cancelled"
    with pytest.raises(StopIteration):
        next(stream)


def test_leaving_a_with_block_releases_the_runtime() -> None:
    rt = reference_runtime()
    with rt.stream("Once upon a time", max_tokens=50, **GREEDY) as stream:
        first = next(stream)
    kept = stream  # still referenced: only the block ended it

    assert isinstance(first, TextDelta) and answer_from_another_thread(rt)
    assert [(type(e), e.finish_reason) for e in kept if isinstance(e, Finished)] == [(Finished, "cancelled")]
    assert list(kept) == []


def test_the_finished_event_releases_the_runtime_before_the_caller_lets_go() -> None:
    rt = reference_runtime()
    stream = rt.stream("Hi", max_tokens=3, **GREEDY)
    events: list[TextDelta | Finished] = []
    while not events or not isinstance(events[-1], Finished):
        events.append(next(stream))

    assert answer_from_another_thread(rt)
    assert list(stream) == []


def test_a_new_call_in_the_same_thread_ends_that_threads_open_stream_with_a_finished_that_says_so() -> None:
    rt = reference_runtime()
    expected = reference_runtime().generate("Hello", max_tokens=4, **GREEDY).text
    first = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
    read = next(first)

    assert rt.generate("Hello", max_tokens=4, **GREEDY).text == expected
    rest = list(first)
    assert len(rest) == 1 and isinstance(rest[0], Finished) and isinstance(read, TextDelta)
    assert rest[0].finish_reason == "preempted" and rest[0].text == read.text  # not cut silently


def test_another_threads_close_waits_for_the_step_in_flight_then_ends_the_stream() -> None:
    backend = ReferenceBackend(seed=3, n_ctx=512)
    rt = runtime_for(backend, None, strategy="none", calibrate=False)
    expected = reference_runtime().generate("Hello", max_tokens=4, **GREEDY).text
    stream = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
    next(stream)
    inside, go_on = threading.Event(), threading.Event()
    real = backend.eval_block

    def held_step(tokens: Sequence[int], logits: Any = "all") -> Any:
        inside.set()
        go_on.wait(BOUND_SECONDS)
        return real(tokens, logits)

    backend.eval_block = held_step  # type: ignore[method-assign]
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(next(stream)))
    reader.start()
    assert inside.wait(BOUND_SECONDS)
    closer = threading.Thread(target=stream.close)
    closer.start()
    go_on.set()
    reader.join(BOUND_SECONDS)
    closer.join(BOUND_SECONDS)
    backend.eval_block = real  # type: ignore[method-assign]

    assert not reader.is_alive() and not closer.is_alive()
    assert len(got) == 1 and isinstance(got[0], TextDelta)  # the step in flight was not torn
    rest = list(stream)
    assert len(rest) == 1 and isinstance(rest[0], Finished) and rest[0].finish_reason == "cancelled"
    assert rt.generate("Hello", max_tokens=4, **GREEDY).text == expected


class CallsBack(threading.Event):
    """A cancel event whose check, made inside each verify step, runs `call`."""

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__()
        self.call = call

    def is_set(self) -> bool:
        self.call()
        return False


def test_a_request_started_inside_a_running_one_is_refused_instead_of_deadlocking() -> None:
    rt = reference_runtime()
    expected = reference_runtime().generate("Hello", max_tokens=4, **GREEDY).text
    inner = CallsBack(lambda: rt.generate("Hi", max_tokens=2, **GREEDY))

    with pytest.raises(InvalidRequestError, match="inside another"):
        rt.generate("Once upon a time", max_tokens=8, cancel=inner, **GREEDY)
    assert rt.generate("Hello", max_tokens=4, **GREEDY).text == expected


def test_a_stream_closed_from_inside_its_own_step_is_refused_instead_of_deadlocking() -> None:
    rt = reference_runtime()
    streams: list[Stream] = []
    inner = CallsBack(lambda: streams[0].close() if streams else None)
    streams.append(rt.stream("Once upon a time", max_tokens=8, cancel=inner, **GREEDY))

    with pytest.raises(InvalidRequestError, match="inside its own step"):
        list(streams[0])
    assert answer_from_another_thread(rt)


def test_a_prepared_prompt_is_not_tokenized_again_and_answers_the_same() -> None:
    rt = reference_runtime()
    expected = rt.generate(messages=CHAT, max_tokens=8, **GREEDY)
    calls: list[str] = []
    real = rt.target.tokenize

    def counted(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        calls.append(text)
        return real(text, add_special=add_special, parse_special=parse_special)

    rt.target.tokenize = counted  # type: ignore[method-assign]
    prompt = rt.prepare(messages=CHAT)
    made = len(calls)
    again = rt.generate(prompt, max_tokens=8, **GREEDY)

    assert made > 0 and len(calls) == made
    assert isinstance(prompt, Prompt) and (again.text, again.tokens) == (expected.text, expected.tokens)
    with pytest.raises(InvalidRequestError, match="not both"):
        rt.generate(prompt, messages=CHAT)


def test_prepare_refuses_a_prompt_that_does_not_fit_and_user_ids_out_of_the_vocabulary() -> None:
    rt = reference_runtime(n_ctx=64)
    with pytest.raises(ContextFullError):
        rt.prepare("x" * 200)
    with pytest.raises(InvalidRequestError, match="whole numbers"):
        rt.prepare([rt.target.info.n_vocab])
    with pytest.raises(ContextFullError):
        rt.generate(Prompt(tuple(range(1, 100))), max_tokens=2)
