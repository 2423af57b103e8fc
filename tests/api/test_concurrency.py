"""One owner of a runtime's concurrency (localspec.turns, issue 56): requests queue in the
order they asked, a call can bound its wait, close() from any thread stops a busy reader within
one step, and asyncio readers never block their event loop. Reference backend: the ownership
is under test; the real model's long prompts are in tests/backends/llamacpp/test_long_prompt_cancel.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from backends.reference import ReferenceBackend
from localspec.api import Event, Finished, Runtime, TextDelta, runtime_for
from localspec.core.errors import BackendClosedError, RuntimeBusyError

GREEDY: dict[str, Any] = {"temperature": 0}
BOUND_SECONDS = 60  # a bound, not a timing: a working runtime answers in well under a second
LONG = 1500  # tokens: an answer that is still running when the test stops it


def reference_runtime(n_ctx: int = 2048) -> tuple[Runtime, ReferenceBackend]:
    backend = ReferenceBackend(seed=3, n_ctx=n_ctx)
    return runtime_for(backend, None, strategy="none", calibrate=False), backend


def expected_hello() -> str:
    return reference_runtime()[0].generate("Hello", max_tokens=4, **GREEDY).text


def wait_until(condition: Callable[[], bool]) -> bool:
    """A condition other threads make true, checked until it holds (or the bound passes)."""
    deadline = time.monotonic() + BOUND_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def in_another_thread(call: Callable[[], object]) -> object:
    """What call returns or raises, run in a thread of its own."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as error:
            out.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(BOUND_SECONDS)
    assert not thread.is_alive() and len(out) == 1
    return out[0]


class Reader(threading.Thread):
    """Reads a stream to its end in its own thread, as a GUI's worker does, drawing each event
    for a moment: the reference backend writes 1500 tokens in about 40 ms, so an unpaced reader
    could finish before another thread had even asked."""

    PACE_SECONDS = 0.002

    def __init__(self, events: Any) -> None:
        super().__init__()
        self.stream = events
        self.got: list[Event] = []
        self.reading = threading.Event()  # set once a few events came: the reader is busy

    def run(self) -> None:
        for event in self.stream:
            self.got.append(event)
            if len(self.got) == 3:
                self.reading.set()
            time.sleep(self.PACE_SECONDS)


def steps_after(events: Sequence[Event], seen: int) -> int:
    """Verify steps' events among those after the first `seen`."""
    return sum(1 for e in events[seen:] if isinstance(e, TextDelta) and e.step is not None)


def passes_by_thread(backend: ReferenceBackend) -> list[threading.Thread]:
    """The thread behind each target pass from now on: a request runs in the thread that
    reads it (generate()'s caller, an astream's own thread)."""
    threads: list[threading.Thread] = []
    real = backend.eval_block

    def noted(tokens: Sequence[int], logits: Any = "all") -> Any:
        threads.append(threading.current_thread())
        return real(tokens, logits)

    backend.eval_block = noted  # type: ignore[method-assign]
    return threads


def in_order_of_first_pass(threads: list[threading.Thread]) -> list[str]:
    return [thread.name for thread in dict.fromkeys(threads)]


# -- close() means stop ---------------------------------------------------------------------


def test_close_from_another_thread_ends_a_busy_readers_answer_within_one_step() -> None:
    rt, _ = reference_runtime()
    reader = Reader(rt.stream("Once upon a time", max_tokens=LONG, **GREEDY))
    reader.start()
    assert reader.reading.wait(BOUND_SECONDS)

    reader.stream.close()
    seen = len(reader.got)
    reader.join(BOUND_SECONDS)

    assert not reader.is_alive()
    last = reader.got[-1]
    assert isinstance(last, Finished) and last.finish_reason == "cancelled"
    assert steps_after(reader.got, seen) <= 1  # at most the step it had in flight
    assert [e for e in reader.got if isinstance(e, Finished)] == [last]
    assert last.stats.generated_tokens < LONG
    assert rt.generate("Hello", max_tokens=4, **GREEDY).text == expected_hello()


def test_runtime_close_from_another_thread_stops_the_reader_and_refuses_the_waiting() -> None:
    rt, _ = reference_runtime()
    reader = Reader(rt.stream("Once upon a time", max_tokens=LONG, **GREEDY))
    reader.start()
    assert reader.reading.wait(BOUND_SECONDS)
    waiting: list[object] = []
    waiter = threading.Thread(target=lambda: waiting.append(in_another_thread(lambda: rt.generate("Hi"))))
    waiter.start()
    assert wait_until(lambda: rt.waiting == 1)

    rt.close()
    seen = len(reader.got)
    reader.join(BOUND_SECONDS)
    waiter.join(BOUND_SECONDS)

    last = reader.got[-1]
    assert isinstance(last, Finished) and last.finish_reason == "cancelled"
    assert steps_after(reader.got, seen) <= 1
    assert len(waiting) == 1 and isinstance(waiting[0], BackendClosedError)
    with pytest.raises(BackendClosedError):
        rt.generate("Hello")


# -- a fair queue, a bounded wait, a question ------------------------------------------------


def test_requests_get_the_runtime_in_the_order_they_asked() -> None:
    rt, backend = reference_runtime()
    holder = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
    next(holder)
    passes = passes_by_thread(backend)
    askers = []
    for name in "abcd":
        ask = threading.Thread(target=rt.generate, args=("Hi",), kwargs={"max_tokens": 2}, name=name)
        ask.start()
        askers.append(ask)
        assert wait_until(lambda: rt.waiting == len(askers))

    holder.close()
    for ask in askers:
        ask.join(BOUND_SECONDS)

    assert in_order_of_first_pass(passes) == list("abcd")
    assert not rt.busy and rt.waiting == 0


def test_a_call_that_waits_past_its_timeout_raises_runtime_busy_saying_what_to_do() -> None:
    rt, _ = reference_runtime()
    assert not rt.busy
    holder = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
    next(holder)

    assert rt.busy
    refused = in_another_thread(lambda: rt.generate("Hi", max_tokens=2, timeout=0.05))
    assert isinstance(refused, RuntimeBusyError)
    assert "timeout=" in str(refused) and "runtime.busy" in str(refused) and "close()" in str(refused)
    assert rt.waiting == 0  # the refused call left the line

    holder.close()
    assert not rt.busy
    answered = in_another_thread(lambda: rt.generate("Hello", max_tokens=4, timeout=0, **GREEDY))
    assert getattr(answered, "text", None) == expected_hello()


# -- asyncio -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_astream_and_agenerate_answer_as_stream_and_generate_do() -> None:
    rt, _ = reference_runtime()
    expected = [(type(e), e.text) for e in rt.stream("Once upon a time", max_tokens=12, **GREEDY)]

    got = [(type(e), e.text) async for e in rt.astream("Once upon a time", max_tokens=12, **GREEDY)]
    completion = await rt.agenerate(messages=[{"role": "user", "content": "Hi"}], max_tokens=6, **GREEDY)

    assert got == expected
    same = rt.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=6, **GREEDY)
    assert (completion.text, completion.tokens, completion.finish_reason) == (same.text, same.tokens, "max_tokens")


@pytest.mark.asyncio
async def test_cancelling_the_reading_task_stops_the_request_and_a_follow_up_runs() -> None:
    rt, backend = reference_runtime()
    passes = counted_passes(backend)
    got: list[Event] = []
    first = asyncio.Event()

    async def read() -> None:
        async for event in rt.astream("Once upon a time", max_tokens=LONG, **GREEDY):
            got.append(event)
            first.set()

    task = asyncio.create_task(read())
    await asyncio.wait_for(first.wait(), BOUND_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    at_cancel = len(passes)
    follow_up = await rt.agenerate("Hello", max_tokens=4, **GREEDY)

    assert follow_up.text == expected_hello()
    assert not any(isinstance(e, Finished) for e in got)
    started = passes.index("Hello")  # the follow-up's first pass: the cancelled one ran at most one step more
    assert started - at_cancel <= 1


def counted_passes(backend: ReferenceBackend) -> list[str]:
    """Each target pass from now on, as "Hello" for the first pass of a prompt that holds
    the text Hello and "step" otherwise."""
    passes: list[str] = []
    real = backend.eval_block
    hello = set(backend.tokenize("Hello", add_special=False, parse_special=False))

    def counted(tokens: Sequence[int], logits: Any = "all") -> Any:
        passes.append("Hello" if hello & set(tokens) and "Hello" not in passes else "step")
        return real(tokens, logits)

    backend.eval_block = counted  # type: ignore[method-assign]
    return passes


@pytest.mark.asyncio
async def test_the_event_loop_runs_while_another_thread_holds_the_runtime() -> None:
    rt, _ = reference_runtime()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with rt.stream("Once upon a time", max_tokens=50, **GREEDY) as events:
            next(events)
            held.set()
            release.wait(BOUND_SECONDS)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(BOUND_SECONDS)
    answer = asyncio.create_task(rt.agenerate("Hello", max_tokens=4, **GREEDY))
    ticks = 0
    deadline = time.monotonic() + BOUND_SECONDS
    while rt.waiting == 0 and time.monotonic() < deadline:
        ticks += 1
        await asyncio.sleep(0.001)  # the loop runs: the waiting happens in the request's thread
    for _ in range(5):
        await asyncio.sleep(0)

    assert rt.waiting == 1 and not answer.done()
    release.set()
    assert (await asyncio.wait_for(answer, BOUND_SECONDS)).text == expected_hello()
    holder.join(BOUND_SECONDS)


@pytest.mark.asyncio
async def test_astream_raises_where_its_events_are_read() -> None:
    rt, _ = reference_runtime()
    holder = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
    next(holder)

    with pytest.raises(RuntimeBusyError):
        async for _ in rt.astream("Hi", max_tokens=2, timeout=0.01):
            pass
    holder.close()
    with pytest.raises(Exception, match="unknown option"):
        await rt.agenerate("Hi", tempreature=0)


@pytest.mark.asyncio
async def test_cancelling_a_task_that_waits_for_the_runtime_takes_it_out_of_the_line() -> None:
    rt, backend = reference_runtime()
    holder = rt.stream("Once upon a time", max_tokens=50, **GREEDY)
    next(holder)
    passes = passes_by_thread(backend)
    waiting = asyncio.create_task(rt.agenerate("Hello", max_tokens=4))
    deadline = time.monotonic() + BOUND_SECONDS
    while rt.waiting == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    assert rt.waiting == 1

    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert rt.waiting == 0  # out of the line at once, not when the runtime frees
    holder.close()
    assert (await rt.agenerate("Hello", max_tokens=4, **GREEDY)).text == expected_hello()
    assert len(set(passes)) == 1  # one request's thread made every pass: the cancelled one never ran
