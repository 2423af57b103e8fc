"""The dispatcher that gives a pool's requests their lanes (localspec.dispatch): in the order
they asked, each on the free lane caching the most of its prompt, within its timeout and a
bounded line. Lanes are granted when one is freed or a request arrives, so these run without
threads; the cache each lane holds is given as token lists."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from localspec.core.drafting import common_prefix
from localspec.core.errors import BackendClosedError, RuntimeBusyError
from localspec.dispatch import Dispatcher, LineFullError, Ticket


def lanes_caching(*caches: Sequence[int], exact: Sequence[int] = ()) -> Dispatcher:
    """Lanes caching these tokens, of which a request keeping only exact rows keeps the first
    exact[lane] (all it shares where not given)."""

    def held(lane: int, prompt: Sequence[int]) -> tuple[int, int]:
        shared = common_prefix(caches[lane], prompt)
        return (min(shared, exact[lane]) if exact else shared), shared

    return Dispatcher(len(caches), held)


def test_requests_get_lanes_in_the_order_they_asked() -> None:
    line = Dispatcher(1)
    first = line.enter(Ticket())
    waiting = [line.enter(Ticket(key=name)) for name in "abc"]
    order = []
    holder = first
    for _ in waiting:
        holder.leave()
        holder = next(t for t in waiting if t.running)
        order.append(holder.key)
    assert order == ["a", "b", "c"]


def test_nobody_overtakes_a_request_that_needs_every_lane() -> None:
    line = Dispatcher(2)
    busy = line.enter(Ticket())
    whole = line.enter(Ticket(whole=True))
    later = line.enter(Ticket())
    assert busy.lane == 0 and whole.waiting and later.waiting  # lane 1 is free, yet `later` waits its turn
    busy.leave()
    assert whole.running and later.waiting
    whole.leave()
    assert later.running and later.lane == 0


def test_a_request_takes_the_free_lane_caching_the_longest_part_of_its_prompt() -> None:
    line = lanes_caching([1, 2], [7, 8, 9], [1, 2, 3, 4])
    follow_up = line.enter(Ticket([1, 2, 3, 4, 5, 6]))
    assert follow_up.lane == 2
    other = line.enter(Ticket([7, 8, 1]))
    assert other.lane == 1
    # Nothing cached of it anywhere free: the lowest free lane.
    assert line.enter(Ticket([5])).lane == 0


def test_a_request_keeping_exact_rows_takes_the_lane_whose_rows_it_keeps_others_the_longest() -> None:
    # Both lanes hold the same start; only lane 1's rows went in as this request's fresh
    # evaluation computes them (one-token passes, where lane 0's came from a long prompt's block).
    shared = [1, 2, 3, 4]
    assert lanes_caching([*shared, 9], [*shared, 8], exact=[0, 4]).enter(Ticket([*shared, 5], reuse="exact")).lane == 1
    # A request reusing any row takes the longest share, exact rows deciding only between equals.
    assert lanes_caching([*shared, 5], shared, exact=[0, 4]).enter(Ticket([*shared, 5, 6])).lane == 0
    assert lanes_caching(shared, shared, exact=[2, 4]).enter(Ticket([*shared, 5])).lane == 1


def test_equal_caches_and_no_prompt_take_the_lowest_free_lane() -> None:
    line = lanes_caching([1], [1], [1])
    held = line.enter(Ticket())
    assert held.lane == 0
    assert line.enter(Ticket([1, 2])).lane == 1
    held.leave()
    assert line.enter(Ticket()).lane == 0


def test_a_request_that_waits_past_its_timeout_leaves_the_line() -> None:
    line = Dispatcher(1)
    held = line.take()
    with pytest.raises(RuntimeBusyError, match="larger parallel"):
        line.take(timeout=0.05)
    assert line.tickets() == ([held], [])
    held.leave()
    assert line.tickets() == ([], [])  # the lane is not given to the request that left


def test_a_line_longer_than_max_waiting_refuses_the_next_request_at_once() -> None:
    line = Dispatcher(1, max_waiting=2)
    held = line.enter(Ticket())
    queued = [line.enter(Ticket()), line.enter(Ticket())]
    with pytest.raises(LineFullError, match="2 requests already wait") as refused:
        line.enter(Ticket())
    assert refused.value.waiting == 2 and len(line.tickets()[1]) == 2
    held.leave()
    assert queued[0].running
    # A free lane is never refused, whatever the bound.
    assert Dispatcher(1, max_waiting=0).enter(Ticket()).running


def test_a_waiting_thread_gets_the_lane_freed_for_it() -> None:
    line = Dispatcher(1)
    held = line.take()
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(line.take().lane))
    waiter.start()
    assert line.wait_for(lambda: len(line.tickets()[1]) == 1, 10)
    held.leave()
    waiter.join(10)
    assert got == [0]


def test_a_cancelled_task_leaves_the_line_and_the_next_one_gets_the_lane() -> None:
    async def scenario() -> tuple[bool, int]:
        line = Dispatcher(1)
        held = line.enter(Ticket())
        cancelled = line.enter(Ticket())
        task = asyncio.ensure_future(line.await_lane(cancelled))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        nxt = line.enter(Ticket())
        waiting = asyncio.ensure_future(line.await_lane(nxt))
        held.leave()
        return cancelled.running, await asyncio.wait_for(waiting, 10)

    assert asyncio.run(scenario()) == (False, 0)


def test_an_awaited_lane_times_out_as_a_busy_runtime() -> None:
    async def scenario() -> None:
        line = Dispatcher(1)
        line.enter(Ticket())
        with pytest.raises(RuntimeBusyError):
            await line.await_lane(line.enter(Ticket()), timeout=0.05)
        assert line.tickets()[1] == []

    asyncio.run(scenario())


def test_a_waiting_room_hands_its_line_over_in_order() -> None:
    room = Dispatcher(0)
    tickets = [room.enter(Ticket(key=key)) for key in ("served", "other", "served")]
    assert not any(t.running for t in tickets)
    pool = Dispatcher(2)
    room.hand_over(pool, lambda ticket: ticket.key != "served")
    # The first gets a lane; the one for another model needs both and holds the line.
    assert [t.state for t in tickets] == ["granted", "waiting", "waiting"]
    tickets[0].leave()
    assert tickets[1].running and tickets[2].waiting


def test_a_closed_pool_sends_its_waiting_requests_away() -> None:
    line = Dispatcher(1)
    line.enter(Ticket())
    waiting = line.enter(Ticket())
    line.close()
    with pytest.raises(BackendClosedError, match="closed"):
        waiting.wait()
    with pytest.raises(BackendClosedError):
        line.enter(Ticket())
