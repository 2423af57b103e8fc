"""An app's pool of lanes on the real model: asyncio tasks await answers side by side without
blocking their event loop, a cancelled task frees its lane, and a conversation's next turn
lands on the lane that caches it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from model_support import TEST_N_CTX

import localspec
from localspec.core.options import LoadOptions
from localspec.pool import Pool

ASKS = [("Write the days of the week.", 40), ("A title for a chat about the week", 12)]
LONG = [{"role": "user", "content": "Count from one to a hundred in words."}]


@pytest.fixture(scope="module")
def pool(smollm2_q4_1: Path) -> Iterator[Pool]:
    with localspec.load_pool(
        str(smollm2_q4_1), parallel=2, n_ctx=TEST_N_CTX, threads=1, strategy="ngram", memory=False
    ) as pool:
        assert len(pool.runtimes) == 2 and pool.note is None
        yield pool


def test_two_tasks_awaiting_answers_at_once_get_the_answers_each_gets_alone(pool: Pool) -> None:
    alone = [pool.generate(prompt, max_tokens=n, temperature=0).text for prompt, n in ASKS]

    async def together() -> list[str]:
        answers = await asyncio.gather(*(pool.agenerate(p, max_tokens=n, temperature=0) for p, n in ASKS))
        return [answer.text for answer in answers]

    assert asyncio.run(together()) == alone


def test_a_task_waiting_for_a_lane_leaves_the_event_loop_running(pool: Pool) -> None:
    async def scenario() -> tuple[int, str]:
        ticks = 0
        async with pool.alane() as first:
            held = pool.alane()
            second = await held.__aenter__()
            assert first is not second
            task = asyncio.ensure_future(pool.agenerate(ASKS[1][0], max_tokens=ASKS[1][1], temperature=0))
            while ticks < 20:  # the loop runs on while the task waits for a lane
                await asyncio.sleep(0.005)
                ticks += 1
            assert not task.done()
            await held.__aexit__(None, None, None)
            answer = await asyncio.wait_for(task, 120)
        return ticks, answer.text

    alone = pool.generate(ASKS[1][0], max_tokens=ASKS[1][1], temperature=0).text
    assert asyncio.run(scenario()) == (20, alone)


def test_a_cancelled_task_frees_its_lane_and_the_next_call_answers(pool: Pool) -> None:
    alone = pool.generate(ASKS[1][0], max_tokens=ASKS[1][1], temperature=0).text

    async def scenario() -> str:
        async with pool.alane() as held:  # the other lane stays taken: only the cancelled one can free
            other = next(runtime for runtime in pool.runtimes if runtime is not held)
            task = asyncio.ensure_future(pool.agenerate(messages=LONG, max_tokens=400, temperature=0))
            for _ in range(12000):  # it decodes before it is cancelled
                if other.busy and other.target.n_past > 0:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            answer = await pool.agenerate(ASKS[1][0], max_tokens=ASKS[1][1], temperature=0, lane_timeout=60)
            return answer.text

    assert asyncio.run(scenario()) == alone


def test_a_conversations_next_turn_runs_on_the_lane_that_caches_it(pool: Pool) -> None:
    chat = [{"role": "user", "content": "Name a colour."}]
    with pool.lane() as taken:  # the first turn goes to the other lane, not the lowest
        first = pool.generate(messages=chat, max_tokens=8, temperature=0)
    cached_on = next(runtime for runtime in pool.runtimes if runtime is not taken)
    follow_up = [*chat, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Another."}]
    with pool.lane(prompt=pool.runtimes[0].prepare(messages=follow_up)) as runtime:
        assert runtime is cached_on


def test_a_short_prompt_keeping_exact_rows_runs_on_the_lane_whose_system_turn_it_keeps(pool: Pool) -> None:
    # Both lanes cache the chat template's system turn: lane 0 from a long prompt's large block,
    # lane 1 from a short prompt's one-token-like block. Only lane 1's rows give a short prompt
    # a fresh evaluation's bits; by the tokens in common alone the lanes tie, and lane 0 won.
    notes = " ".join(f"Note {i}: the ferry leaves pier {i % 7 + 1}." for i in range(40))
    long = pool.runtimes[0].generate(messages=[{"role": "user", "content": notes}], max_tokens=2, temperature=0)
    short = pool.runtimes[1].generate(messages=[{"role": "user", "content": "Name three birds."}], max_tokens=2)
    assert long.stats.prompt_tokens > 128 and short.stats.prompt_tokens < 63
    ask = [{"role": "user", "content": "Write two colours."}]
    with pool.lane(prompt=pool.runtimes[0].prepare(messages=ask), reuse="exact") as runtime:
        assert runtime is pool.runtimes[1]
    answer = pool.generate(messages=ask, max_tokens=4, temperature=0, reuse_prefix="exact")
    assert answer.stats.prefill_tokens < answer.stats.prompt_tokens - 10  # the system turn was kept
    assert answer.stats.reused_tokens == 0  # and nothing that may part from a fresh evaluation


def test_the_default_lanes_leave_room_for_a_draft_models_caches_too(
    smollm2_q4_1: Path, derived_models, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    from localspec.pool import default_parallel, lane_estimate

    opts = LoadOptions.of(model=str(smollm2_q4_1), n_ctx=TEST_N_CTX)
    free = psutil.virtual_memory()._replace(available=4 * 4 * lane_estimate(opts))  # a quarter holds 4 lanes
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    assert default_parallel(opts) == 4
    # A Q8_0 copy drafts beside it: each lane holds two caches of the same size, so 2 fit
    # (the target's output rows are counted once).
    assert default_parallel(replace(opts, strategy="draft", draft_model=str(derived_models["Q8_0"]))) == 2
    # n-gram lookup loads no drafter file, whatever was given.
    assert default_parallel(replace(opts, strategy="ngram", draft_model=str(derived_models["Q8_0"]))) == 4


def test_every_shared_pass_runs_on_one_thread_whichever_lane_asked(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    # llama.cpp's OpenMP workers belong to the thread that starts a pass: passes started from
    # each request's own thread kept a team per thread spinning against each other (lanes.py).
    from localspec.backends.llamacpp import lanes

    ran_on: set[str] = set()
    run = lanes.LaneHost._run

    def recording(host: lanes.LaneHost, asks: list[Any]) -> None:
        ran_on.add(threading.current_thread().name)
        run(host, asks)

    monkeypatch.setattr(lanes.LaneHost, "_run", recording)

    async def together() -> list[str]:
        answers = await asyncio.gather(*(pool.agenerate(p, max_tokens=n, temperature=0) for p, n in ASKS))
        return [answer.text for answer in answers]

    asyncio.run(together())
    assert len(ran_on) == 1 and ran_on.pop().startswith("localspec-compute")  # compute.py's, every pass's


def test_closing_a_pool_writes_what_its_lanes_learnt_since_their_last_write(
    smollm2_q4_1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localspec.control import calibrate

    written: list[int] = []
    monkeypatch.setattr(calibrate.LearntCurve, "close", lambda self: written.append(1))
    pool = localspec.load_pool(str(smollm2_q4_1), parallel=2, n_ctx=TEST_N_CTX, threads=1, strategy="ngram")
    pool.close()
    assert len(written) == 2  # one a lane, before the models go
