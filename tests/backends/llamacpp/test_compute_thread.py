"""Every llama.cpp pass of more than one CPU thread runs on one thread of the process, whichever
thread asks: a second living thread that had run passes would keep a second OpenMP team, and
from then on every pass of the process would run 30-45 % slower (backends/llamacpp/compute.py).
A pool's shared passes: tests/api/test_pool.py."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.model_support import TEST_N_CTX

ASK = [{"role": "user", "content": "Name three rivers."}]


@contextmanager
def decoding_threads() -> Iterator[set[str]]:
    """The names of the threads that call llama_decode while the block runs."""
    from localspec.backends.llamacpp import library

    names: set[str] = set()
    real = library.llama.llama_decode

    def noted(ctx: object, batch: object) -> int:
        names.add(threading.current_thread().name)
        return int(real(ctx, batch))

    library.llama.llama_decode = noted
    try:
        yield names
    finally:
        library.llama.llama_decode = real


def test_an_app_asking_from_several_threads_has_every_pass_run_on_one(smollm2_q4_1: Path) -> None:
    import localspec

    runtime = localspec.load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=2, strategy="none", calibrate=False)
    try:
        with decoding_threads() as names:
            alone = runtime.generate(messages=ASK, max_tokens=12, temperature=0).text
            from_worker = ThreadPoolExecutor(max_workers=1).submit(
                lambda: runtime.generate(messages=ASK, max_tokens=12, temperature=0).text
            )

            async def streamed() -> str:
                return "".join(
                    [
                        e.text
                        async for e in runtime.astream(messages=ASK, max_tokens=12, temperature=0)
                        if isinstance(e, localspec.TextDelta)
                    ]
                )

            assert from_worker.result() == alone
            assert asyncio.run(streamed()) == alone
    finally:
        runtime.close()
    assert len(names) == 1 and next(iter(names)).startswith("localspec-compute")


def test_a_context_on_one_cpu_thread_decodes_where_it_is_asked(smollm2_q4_1: Path) -> None:
    # One CPU thread makes no OpenMP team: handing its passes over would only cost a wake-up.
    import localspec

    runtime = localspec.load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=1, strategy="none", calibrate=False)
    try:
        with decoding_threads() as names:
            runtime.generate(messages=ASK, max_tokens=4, temperature=0)
    finally:
        runtime.close()
    assert names == {threading.current_thread().name}


class Interrupted(Exception):
    pass


def test_a_caller_interrupted_while_its_pass_runs_waits_the_pass_out() -> None:
    # The context must not be touched (a rollback, a close) while its pass still runs there.
    from localspec.backends.llamacpp import compute

    ended: list[float] = []

    def pass_of_a_while() -> int:
        time.sleep(0.3)
        ended.append(time.perf_counter())
        return 0

    def interrupt(*_: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
    try:
        timer.start()
        with pytest.raises(Interrupted):
            compute.run(2, pass_of_a_while)
        assert ended, "the caller went on while its pass still ran"
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def test_passes_in_place_run_on_the_asking_thread_and_shared_passes_still_on_one(smollm2_q4_1: Path) -> None:
    # `localspec serve` runs a request a thread, one at a time: its passes stay where asked.
    import localspec
    from localspec.backends.llamacpp import compute

    runtime = localspec.load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=2, strategy="none", calibrate=False)
    try:
        with compute.in_place(), decoding_threads() as names:
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="a-request").submit(
                lambda: runtime.generate(messages=ASK, max_tokens=4, temperature=0)
            ).result()
            assert compute.run_there(threading.current_thread) is not threading.current_thread()
    finally:
        runtime.close()
    assert len(names) == 1 and next(iter(names)).startswith("a-request")


def test_localspec_run_decodes_on_its_own_thread(smollm2_q4_1: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The CLI's one-thread commands keep their passes where asked (localspec/cli/main.py).
    from localspec.cli.main import main

    args = ["run", "Name three rivers.", "-t", "0", "-n", "4", "--model", str(smollm2_q4_1), "--ctx", str(TEST_N_CTX)]
    with decoding_threads() as names:
        assert main([*args, "--threads", "2", "-s", "none"]) == 0
    assert capsys.readouterr().out.strip()
    assert names == {threading.current_thread().name}


def test_a_pass_asked_once_no_thread_can_start_runs_where_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # At interpreter shutdown an executor takes no new work: a last pass (a stream closed at
    # exit rolling back a hybrid's state) must still run, not end the program in a traceback.
    from localspec.backends.llamacpp import compute

    class Refusing:
        def submit(self, *_: object) -> None:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(compute, "_thread", Refusing)
    assert compute.run(2, threading.current_thread) is threading.current_thread()


@pytest.fixture(scope="module")
def handed_over(smollm2_q4_1: Path) -> Iterator[Any]:
    """A runtime whose passes use 2 CPU threads, so each goes to the compute thread."""
    import localspec

    runtime = localspec.load(str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=2, strategy="none", calibrate=False)
    yield runtime
    runtime.close()


def test_a_stream_closed_from_another_thread_mid_answer_ends_and_the_runtime_answers_again(handed_over: Any) -> None:
    import localspec

    alone = handed_over.generate(messages=ASK, max_tokens=24, temperature=0).text
    stream = handed_over.stream(messages=ASK, max_tokens=24, temperature=0)
    got: list[object] = []
    started = threading.Event()

    def read() -> None:
        for event in stream:
            got.append(event)
            started.set()

    with decoding_threads() as names:
        reader = threading.Thread(target=read)
        reader.start()
        assert started.wait(60)
        stream.close()
        reader.join(60)
    assert not reader.is_alive() and isinstance(got[-1], localspec.Finished)
    assert got[-1].finish_reason in ("cancelled", "max_tokens")  # a fast host may finish first
    assert handed_over.generate(messages=ASK, max_tokens=24, temperature=0).text == alone
    assert len(names) == 1 and next(iter(names)).startswith("localspec-compute")


def test_a_long_prompt_closed_mid_prefill_is_stopped_by_the_compute_thread(handed_over: Any) -> None:
    # llama.cpp asks the stop from inside the pass, which now runs on the compute thread.
    import localspec

    notes = " ".join(f"Note {i}: the ferry leaves pier {i % 12 + 1} with {i * 7} crates." for i in range(200))
    prompt = handed_over.target.tokenize(notes, add_special=True, parse_special=False)[:1500]
    handed_over.target.rollback(0)
    stream = handed_over.stream(prompt, max_tokens=4, temperature=0)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(stream))
    reader.start()
    while handed_over.target.n_past == 0 and reader.is_alive():
        time.sleep(0.001)  # the first piece is in
    stream.close()
    reader.join(120)
    assert not reader.is_alive() and len(got) == 1
    assert isinstance(got[0], localspec.Finished) and got[0].finish_reason == "cancelled"
    assert handed_over.target.n_past < len(prompt) - 1


def test_an_astream_task_cancelled_mid_answer_frees_the_runtime_for_the_same_answer(handed_over: Any) -> None:
    import localspec

    alone = handed_over.generate(messages=ASK, max_tokens=24, temperature=0).text

    async def cancelled_then_again() -> str:
        started = asyncio.Event()

        async def read() -> None:
            async for _ in handed_over.astream(messages=ASK, max_tokens=24, temperature=0):
                started.set()

        task = asyncio.create_task(read())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        answer = await handed_over.agenerate(messages=ASK, max_tokens=24, temperature=0)
        assert isinstance(answer, localspec.Completion)
        return answer.text

    assert asyncio.run(cancelled_then_again()) == alone
