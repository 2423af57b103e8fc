"""The server's jobs in the served pool's line (localspec.dispatch): a job for another pair
waits until it holds every runtime, the pair is loaded in place of the served one, and the
jobs behind it keep their order across the swap. On the reference backend, a real one."""

from __future__ import annotations

import threading

from localspec.api import Finished, Runtime, load
from localspec.core.sampling import SamplingConfig
from localspec.server.request_prompts import stream_kwargs
from localspec.server.worker import Item, Job, Worker


def loader(model: str) -> Runtime:
    return load(f"reference:seed={model}", backend="reference", calibrate=False)


def job(model: str, ended: list[str], gate: threading.Event | None = None) -> Job:
    def emit(item: Item) -> None:
        if gate is not None:
            gate.wait(30)
        if isinstance(item, Finished):
            ended.append(model)
        elif isinstance(item, BaseException):
            ended.append(f"{model}: {item!r}")

    request = stream_kwargs(prompt="one two", max_tokens=2, stop=(), sampling=SamplingConfig(temperature=0))
    return Job(model, request, emit, deltas=False)


def test_jobs_for_another_pair_wait_their_turn_and_those_behind_keep_their_order() -> None:
    worker = Worker(None, "0", loader, max_queue=8)
    worker.begin()
    gate, ended = threading.Event(), []
    try:
        jobs = [job("0", ended, gate), job("1", ended), job("0", ended), job("1", ended)]
        worker.submit(jobs[0])
        assert worker.wait_until(lambda s: s["running"] == 1, 60)
        for later in jobs[1:]:
            worker.submit(later)
        assert worker.status()["waiting"] == 3 and worker.queue_by_model() == {"0": (1, 1), "1": (0, 2)}
        gate.set()
        for each in jobs:
            assert each.finished.wait(60)
        assert ended == ["0", "1", "0", "1"] and [j.outcome for j in jobs] == ["finished"] * 4
        assert worker.model_id == "1" and worker.status()["served"] == 4
    finally:
        worker.close()


def test_a_job_whose_client_left_while_it_waited_never_runs() -> None:
    worker = Worker(loader("0"), "0", loader, max_queue=8)
    gate, ended = threading.Event(), []
    try:
        first, left = job("0", ended, gate), job("0", ended)
        worker.submit(first)
        assert worker.wait_until(lambda s: s["running"] == 1, 60)
        worker.submit(left)
        worker.withdraw(left)
        assert left.outcome == "cancelled" and worker.status()["waiting"] == 0
        gate.set()
        assert first.finished.wait(60) and left.finished.is_set()
        assert worker.wait_until(lambda s: s["running"] == 0, 60) and ended == ["0"]
    finally:
        worker.close()
