"""serve --parallel: requests decoded in shared llama.cpp passes (backends/llamacpp/lanes.py),
each answer the same as the request served alone, greedy and seeded; a side request starts
while a stream runs; a burst is answered whole. Real model, real server, real HTTP clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from model_support import TEST_N_CTX
from prometheus_client.parser import text_string_to_metric_families
from server_support import chat_answer, close_and_cancel_mid_answer

from localspec.api import TextDelta
from localspec.core.backend_loader import load_backend
from localspec.core.options import LoadOptions
from localspec.pool import Pool, batches, load_pool
from localspec.server import LocalServer, Settings
from localspec.server.worker import Job

MODEL = "smollm2-135m"
# Text that repeats, so n-gram lookup drafts, a draft is partly accepted and the rest rolled
# back, and blocks of several widths meet in one pass.
PROMPTS = [
    "Repeat this list three times: apple, banana, cherry, date, elderberry.",
    "Count from one to twenty in words.",
    "Write the alphabet twice, separated by commas.",
    "Say 'the quick brown fox jumps over the lazy dog' four times.",
    "Write a short poem about the sea.",
    "What is the capital of France? Answer in one sentence.",
    "List the days of the week, then list them again backwards.",
    "Explain what a verb is, with two examples.",
    "Repeat: red green blue, red green blue, red green blue.",
    "Name five animals that live in the ocean.",
]


@contextmanager
def pooled(model: Path, parallel: int, strategy: str = "ngram", **more: Any) -> Iterator[tuple[LocalServer, Pool]]:
    opts = LoadOptions(model=str(model), n_ctx=TEST_N_CTX, strategy=strategy, threads=1, memory=False, **more)
    pool = load_pool(opts, parallel=parallel)
    server = LocalServer(None, MODEL, lambda _: pool, port=0, settings=Settings(log=lambda line: None))
    with server:
        server.start()
        assert server.wait_ready(120)
        yield server, pool


def _ask(url: str, body: dict[str, object]) -> str:
    return str(chat_answer(url, body)["choices"][0]["message"]["content"])


def _from_four_clients(url: str, bodies: list[dict[str, object]]) -> list[dict[str, Any]]:
    """Each body's answer, asked by four clients at once, each taking every fourth body."""
    together: list[dict[str, Any]] = [{} for _ in bodies]

    def client(k: int) -> None:
        for i in range(k, len(bodies), 4):
            together[i] = chat_answer(url, bodies[i])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return together


def _bodies() -> list[dict[str, object]]:
    greedy = [{"temperature": 0} for _ in PROMPTS]
    seeded = [{"temperature": 0.9, "seed": 11 + i} for i in range(len(PROMPTS))]
    return [
        {"model": MODEL, "messages": [{"role": "user", "content": p}], "max_tokens": 40, **knobs}
        for p, knobs in zip(PROMPTS * 2, greedy + seeded, strict=True)
    ]


def test_twenty_answers_are_the_same_alone_and_from_four_concurrent_clients(smollm2_q4_1: Path) -> None:
    bodies = _bodies()
    with pooled(smollm2_q4_1, 4) as (server, pool):
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        alone = [_ask(server.url, body) for body in bodies]
        shared_before = host.figures.shared_passes
        together: list[str | None] = [None] * len(bodies)

        def client(k: int) -> None:
            for i in range(k, len(bodies), 4):
                together[i] = _ask(server.url, bodies[i])

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        figures = host.figures
    assert together == alone
    # The concurrent round really shared passes, with drafts (rows of several widths) in them.
    assert figures.shared_passes - shared_before > 20
    assert figures.rows > figures.passes


def test_a_draft_models_lanes_leave_each_answer_the_one_it_gets_alone(smollm2_q4_1: Path, derived_models) -> None:
    # A Q8_0 copy of the target drafts 4 tokens a step for each of 4 lanes, in lanes of its
    # own whose passes are shared too: it agrees often, so drafts are accepted, and where it
    # does not they are rolled back, in the target's lanes and the drafter's alike.
    bodies = [body for pair in zip(_bodies()[:6], _bodies()[10:16], strict=True) for body in pair]
    draft = str(derived_models["Q8_0"])
    with pooled(smollm2_q4_1, 4, strategy="draft", draft_model=draft, draft_tokens=4) as (server, pool):
        assert len(pool.runtimes) == 4 and pool.note is None
        drafters = {id(runtime.plan.draft) for runtime in pool.runtimes}
        assert len(drafters) == 4  # a drafter lane each
        drafter_host = pool.runtimes[0].plan.draft.host  # type: ignore[union-attr]
        alone = [chat_answer(server.url, body) for body in bodies]
        shared_before, rollbacks_before = drafter_host.figures.shared_passes, drafter_host.figures.rollbacks
        together = _from_four_clients(server.url, bodies)
        figures = drafter_host.figures
    assert [a["choices"][0]["message"]["content"] for a in together] == [
        a["choices"][0]["message"]["content"] for a in alone
    ]
    drafted = sum(a["speculation"]["drafted_tokens"] for a in together)
    accepted = sum(a["speculation"]["accepted_tokens"] for a in together)
    assert drafted > accepted > drafted // 2, (drafted, accepted)
    # The drafter's lanes shared passes, and rolled back what the target refused.
    assert figures.shared_passes > shared_before and figures.rollbacks > rollbacks_before


def test_a_padded_shared_pass_gives_each_lane_the_rows_it_gets_alone(smollm2_q4_1: Path) -> None:
    # Lanes of 1 and 3 rows in one pass: the narrow block padded to 3, row for row what a lone
    # backend computes for the same tokens.
    prompt_a, prompt_b = list(range(200, 240)), list(range(300, 330))
    lone = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=1)
    try:
        lone.eval_block(prompt_a, "none")
        want_a = lone.eval_block([7], "all").copy()
        lone.rollback(0)
        lone.eval_block(prompt_b, "none")
        want_b = lone.eval_block([9, 10, 11], "all").copy()
    finally:
        lone.close()
    backend = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=1, lanes=2)
    try:
        host = backend.lane_host()  # type: ignore[attr-defined]
        a, b = host.lanes
        a.eval_block(prompt_a, "none")
        b.eval_block(prompt_b, "none")
        got: dict[str, np.ndarray] = {}
        host.cost = lambda rows: float(rows > 0)  # padding is free here: the pass is shared
        threads = [
            threading.Thread(target=lambda: got.__setitem__("a", a.eval_block([7], "all"))),
            threading.Thread(target=lambda: got.__setitem__("b", b.eval_block([9, 10, 11], "all"))),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert host.figures.shared_passes == 1 and host.figures.padded_rows == 2
        assert np.array_equal(got["a"], want_a) and np.array_equal(got["b"], want_b)
        assert a.n_past == len(prompt_a) + 1 and b.n_past == len(prompt_b) + 3
    finally:
        backend.close()


def test_an_idle_lane_between_two_fills_their_pass_and_keeps_its_own_cache(smollm2_q4_1: Path) -> None:
    # Lanes 0 and 2 in one pass run in llama.cpp as two (split_equal takes consecutive streams
    # only): lane 1, idle with a prompt cached, joins as padding. Each lane still gets its lone
    # rows, and lane 1's next block reads its cache as it was.
    prompts = [list(range(200, 240)), list(range(400, 420)), list(range(300, 330))]
    steps = [[7], [8], [9]]
    lone = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=1)
    want = []
    try:
        for prompt, step in zip(prompts, steps, strict=True):
            lone.rollback(0)
            lone.eval_block(prompt, "none")
            want.append(lone.eval_block(step, "all").copy())
    finally:
        lone.close()
    backend = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=TEST_N_CTX, threads=1, lanes=3)
    try:
        host = backend.lane_host()  # type: ignore[attr-defined]
        lanes = host.lanes
        for lane, prompt in zip(lanes, prompts, strict=True):
            lane.eval_block(prompt, "none")
        host.cost = lambda rows: float(rows > 0)  # a pass costs the same whatever its rows
        got: dict[int, np.ndarray] = {}

        def step(k: int) -> None:
            got[k] = lanes[k].eval_block(steps[k], "all")

        threads = [threading.Thread(target=step, args=(k,)) for k in (0, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        figures = host.figures
        assert figures.filled_passes == 1 and figures.shared_passes == 1 and figures.padded_rows == 1
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[2], want[2])
        assert lanes[1].n_past == len(prompts[1])
        assert np.array_equal(lanes[1].eval_block(steps[1], "all"), want[1])
    finally:
        backend.close()


def test_a_k_quant_pass_never_holds_more_rows_than_its_kernels_keep_exact(derived_models) -> None:
    # Q4_K_M's tiled matmul takes 8+ rows: passes stay at 7, so 4 lanes of 3 rows go 2 a pass.
    backend = load_backend("llamacpp", str(derived_models["Q4_K_M"]), n_ctx=TEST_N_CTX, threads=1, lanes=4)
    try:
        host = backend.lane_host()  # type: ignore[attr-defined]
        assert host.row_limit == 7
        threads = [threading.Thread(target=lane.eval_block, args=([5, 6, 7], "all")) for lane in host.lanes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert host.figures.rows == 12 and host.figures.passes >= 2
        assert host.figures.widest <= 7
    finally:
        backend.close()


def test_a_side_request_starts_within_a_step_while_a_stream_runs(smollm2_q4_1: Path) -> None:
    # Open WebUI asks for a title beside the answer it streams: the title must not wait for
    # the stream's end. Counted in the stream's own steps, not in seconds.
    with pooled(smollm2_q4_1, 2, strategy="none") as (server, _):
        worker, jobs, marks = server.worker, [], {}
        submit = worker.submit

        def watched(job: Job) -> None:
            if jobs:  # the side request: the stream's steps when it arrives and when it answers
                stream, emit = jobs[0], job.emit
                marks["arrived"] = stream.steps

                def first(item: object) -> None:
                    if isinstance(item, TextDelta) and item.tokens and "answered" not in marks:
                        marks["answered"] = stream.steps
                    emit(item)

                job.emit = first
            jobs.append(job)
            submit(job)

        worker.submit = watched  # type: ignore[method-assign]
        side_done = threading.Event()

        def side() -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "A title for a story"}], "stream": True}
            body |= {"max_tokens": 8, "temperature": 0}
            with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=120) as response:
                assert response.status_code == 200
                for _ in response.iter_lines():
                    pass
            side_done.set()

        body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "stream": True}
        body |= {"max_tokens": 200, "temperature": 0}
        chunks = 0
        with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    chunks += 1
                    if chunks == 20:
                        threading.Thread(target=side).start()
        assert side_done.wait(60)
    # A free thread takes it at once; its prompt takes one pass between two of the stream's
    # steps, and its first step shares a pass with the stream's: 2-4 of the stream's steps on
    # a quiet host. The stream goes on while the side request is set up, more steps on a busy
    # CI host (a pass waits 20 ms at most for a lane being set up), so the bound is 20: one
    # request at a time, it would wait for all of the stream's 200.
    assert chunks > 60 and marks["answered"] - marks["arrived"] <= 20, marks


def test_a_burst_of_24_requests_is_answered_whole(smollm2_q4_1: Path) -> None:
    with pooled(smollm2_q4_1, 4) as (server, pool):
        statuses: list[int] = []

        def one(i: int) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Say the number {i}."}]}
            response = httpx.post(f"{server.url}/chat/completions", json=body | {"max_tokens": 6}, timeout=300)
            statuses.append(response.status_code)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        metrics = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=30).text
        ran = pool.shared_passes()
    assert statuses == [200] * 24
    # /metrics counts the lanes' passes as llama-server counts llama_decode calls: shared by
    # the lanes that waited, so fewer than the requests' own verify passes added up.
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert samples["llamacpp:n_decode_total"] == ran
    assert 0 < samples["llamacpp:n_decode_total"] < samples["localspec:verify_passes_total"]


def test_the_server_and_the_app_share_the_pools_line_and_a_follow_up_runs_where_its_chat_is(
    smollm2_q4_1: Path,
) -> None:
    with pooled(smollm2_q4_1, 2) as (server, pool):
        chat = [{"role": "user", "content": "Name a colour."}]
        with pool.lane() as taken:  # the app holds the lowest runtime: the server's job gets the other
            first = _ask(server.url, {"model": MODEL, "messages": chat, "max_tokens": 8, "temperature": 0})
        elsewhere = pool.runtimes.index(taken) ^ 1
        assert _lane_of_last(server, 1) == elsewhere
        chat += [{"role": "assistant", "content": first}, {"role": "user", "content": "Another one."}]
        _ask(server.url, {"model": MODEL, "messages": chat, "max_tokens": 8, "temperature": 0})
        # Both runtimes are free now; the follow-up goes where its first turn is cached.
        assert _lane_of_last(server, 2) == elsewhere


def _lane_of_last(server: LocalServer, served: int) -> int | None:
    """The runtime the server's last job ran on, once it has left it (its answer is sent a moment before)."""
    assert server.worker.wait_until(lambda s: s["served"] == served, 60)
    ticket = server.worker.history[-1].ticket
    return ticket.lane if ticket is not None else None


def test_a_strategy_that_cannot_batch_is_served_one_request_at_a_time_and_says_why(tmp_path: Path) -> None:
    from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
    from localspec.testing.gguf_writer import Spec

    why = batches(LoadOptions(model="reference:seed=0", backend="reference"))
    assert why is not None and "one request at a time" in why
    why = batches(LoadOptions(model="t.gguf", strategy="qspec"))
    assert why is not None and "'qspec'" in why and "a draft model and drafters reading the target batch" in why
    head = str(write_eagle3_gguf(Spec("llama"), HeadSpec(), tmp_path / "eagle3-head.gguf"))
    for strategy in ("auto", "eagle3"):  # a head gets a context per lane (test_batching_heads.py)
        assert batches(LoadOptions(model="t.gguf", draft_model=head, strategy=strategy)) is None
    from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

    assistant = str(write_gemma4_pair(Gemma4Spec(), tmp_path)[1])
    for strategy in ("auto", "mtp"):  # an assistant reads each lane's stream of the target's cache
        assert batches(LoadOptions(model="t.gguf", draft_model=assistant, strategy=strategy)) is None
    for strategy in ("dflash", "dspark"):  # and so does a block drafter
        assert batches(LoadOptions(model="t.gguf", draft_model="d.gguf", strategy=strategy)) is None
    for strategy in ("draft", "auto"):  # a draft model of its own gets lanes beside the target's
        assert batches(LoadOptions(model="t.gguf", draft_model="d.gguf", strategy=strategy)) is None
    assert batches(LoadOptions(model="t.gguf", strategy="ngram")) is None
    assert batches(LoadOptions(model="t.gguf", mmproj="p.gguf")) is None  # lanes read images too
    # Lanes run where a lone request would: on this machine's GPU too (its passes sized by the
    # device check at load), not over RPC, whose servers take one request's passes.
    assert batches(LoadOptions(model="t.gguf", gpu_layers=99)) is None
    why = batches(LoadOptions(model="t.gguf", rpc=("127.0.0.1:50052",)))
    assert why is not None and "--rpc" in why
    pool = load_pool("reference:seed=0", backend="reference", parallel=4)
    try:
        assert len(pool.runtimes) == 1 and pool.note is not None
    finally:
        pool.close()


@pytest.mark.parametrize("value", ["0", "17", "x"])
def test_serve_refuses_a_parallel_it_cannot_run(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from localspec.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--parallel", value])
    assert exited.value.code == 2
    assert "expected a whole number from 1 to 16" in capsys.readouterr().err


def test_an_app_asks_a_pool_from_several_threads_and_gets_the_answers_it_gets_alone(smollm2_q4_1: Path) -> None:
    # A desktop app's worker streams an answer while its UI thread asks for a title: two
    # runtimes of one pool, each held by one caller at a time, their passes shared.
    import localspec

    asks = [("Write the days of the week.", 40), ("A title for a chat about the week", 12)]
    with localspec.load_pool(
        str(smollm2_q4_1), parallel=2, n_ctx=TEST_N_CTX, threads=1, strategy="ngram", memory=False
    ) as pool:
        assert isinstance(pool, Pool) and len(pool.runtimes) == 2 and pool.note is None
        alone = [pool.generate(p, max_tokens=n, temperature=0).text for p, n in asks]
        together = [""] * len(asks)

        def one(i: int) -> None:
            together[i] = pool.generate(asks[i][0], max_tokens=asks[i][1], temperature=0).text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert together == alone
        with pool.lane() as first, pool.lane() as second:
            assert first is not second
            with pytest.raises(localspec.RuntimeBusyError, match="larger parallel"), pool.lane(timeout=0.05):
                pass


def test_a_lane_prices_its_rows_on_what_they_add_to_a_shared_pass() -> None:
    from localspec.control.costs import SharedPassCurve

    # 5 ms a pass and 6 ms a row, as a small model on this CPU: alone a 5-row block costs 35 ms
    # against 11 for one row. Beside three busy lanes a plain step adds 6 ms to their pass; a
    # 5-row block cannot join their 1-row pass (every lane of a pass has the same rows), so it
    # costs a pass of its own, 35 ms, which is less than padding the three others to 5 rows
    # (t(20) - t(3) = 102 ms).
    lone = [0.005 + 0.006 * k for k in range(1, 33)]
    busy = [1]
    shared = SharedPassCurve(lone, busy=lambda: busy[0])
    assert shared.verify(1) == pytest.approx(0.011) and shared.verify(5) == pytest.approx(0.035)
    busy[0] = 4
    assert shared.verify(1) == pytest.approx(0.006) and shared.verify(5) == pytest.approx(0.035)
    # On a flat curve (a GPU's: 10 ms a pass, 0.1 ms a row) padding the others costs less.
    flat = SharedPassCurve([0.010 + 0.0001 * k for k in range(1, 33)], busy=lambda: busy[0])
    assert flat.verify(5) == pytest.approx(0.0001 * (20 - 3))
    # A model with recurrent state pads no lane: there a 5-row block runs in a pass of its own.
    unpadded = SharedPassCurve([0.010 + 0.0001 * k for k in range(1, 33)], busy=lambda: busy[0], pads=False)
    assert unpadded.verify(5) == pytest.approx(0.0105) and unpadded.verify(1) == pytest.approx(0.0001)
    # Beside others a step's time holds their passes: nothing is learnt from it, and what a
    # later load starts from stays the lone curve.
    before = shared.scale
    shared.update(1, 0.040)
    assert shared.scale == before
    assert shared.learnt()[0][:2] == pytest.approx([0.011, 0.017])
    busy[0] = 1  # alone, a step is a pass: the drift is learnt as ever
    for _ in range(20):
        shared.update(1, 0.040)
    assert shared.scale > before


@pytest.mark.parametrize("kept", [0.97, 0.3])
def test_a_lane_drafts_where_its_draft_adds_to_the_whole_pass_tokens_per_second(kept: float) -> None:
    from dataclasses import replace

    from localspec.control.costs import SharedPassCurve
    from localspec.control.factory import ngram_policy

    # A small model on a CPU: 31 ms a pass, 1 ms a row. Beside three busy lanes, a plain step
    # adds 1 ms to their 33 ms pass and a 15-token draft adds 24 ms (padding the others to 16
    # rows). Weighed against its own plain step alone (1 token for 1 ms), no draft ever paid,
    # not even one whose every guess comes true; weighed on the whole pass (3 + 1 tokens in
    # 34 ms), one kept 97 % of the time pays, one kept 30 % does not.
    busy = [4]
    curve = SharedPassCurve([0.030 + 0.001 * k for k in range(1, 33)], busy=lambda: busy[0])
    assert curve.beside() == (3.0, pytest.approx(0.033))
    policy = replace(ngram_policy(curve), by_support=[kept] * 9)
    gamma = policy.choose(15, support=8)
    assert (gamma >= 8) if kept > 0.5 else (gamma == 0), gamma
    busy[0] = 1  # alone, the lone curve's choice: both draft on its own step of 31 ms
    assert curve.beside() == (0.0, 0.0) and policy.choose(15, support=8) > 0


def test_beside_other_lanes_a_proven_copy_the_curve_keeps_short_is_not_probed() -> None:
    from localspec.control.config import DEFAULT
    from localspec.control.costs import SharedPassCurve
    from localspec.control.factory import ngram_policy

    # This AVX2 host's Q4_1 curve, lone (ms): a block of 16 costs 9.6 steps. Beside three busy
    # lanes a 15-token draft runs a pass of its own, 197 ms on top of their 44: a loss for the
    # batch even when every token is kept (19 tokens in 241 ms against 4 in 47 ms). The probe,
    # there to time a longer pass, timed nothing here (the shared curve learns only alone), so
    # it ran such a pass every 32 steps of a strong copy.
    lone_ms = [20.5, 40.8, 43.7, 46.7, 58.3, 73.0, 87.6, 102.4, 115.0, 127.6, 140.3, 152.9, 163.8, 174.7, 185.6, 196.6]
    busy = [4]
    curve = SharedPassCurve([t / 1e3 for t in lone_ms], busy=lambda: busy[0])
    policy = ngram_policy(curve)
    gammas = [policy.choose(15, support=29) for _ in range(3 * DEFAULT.probe_after)]
    assert gammas == [0] * len(gammas)  # a 12-token probe every 32 steps before
    busy[0] = 1  # alone, the curve times what it runs: the proven copy is drafted long
    assert max(policy.choose(15, support=29) for _ in range(DEFAULT.probe_after)) >= 8


def test_a_lanes_policy_is_the_lone_policy_priced_on_the_targets_calibration_as_shared_passes() -> None:
    from dataclasses import replace

    from localspec.control.calibrate import starting_calibration
    from localspec.control.costs import SharedPassCurve
    from localspec.control.factory import ngram_policy, shared_policy

    target = load_backend("reference", "reference:seed=0")
    try:
        lone = ngram_policy(starting_calibration(target).cost_curve())
        busy = [1]
        lane = shared_policy(lone, target, lambda: busy[0])
        assert isinstance(lane.costs, SharedPassCurve) and lane.costs.verify_seconds is not lone.costs.verify_seconds
        assert replace(lane, costs=lone.costs) == lone  # every other setting is the lone policy's
        alone = [lone.costs.verify(k, depth) for k in range(1, 9) for depth in (0, 2000)]
        assert [lane.costs.verify(k, depth) for k in range(1, 9) for depth in (0, 2000)] == alone
        busy[0] = 3
        # The reference model's prior prices a row under a microsecond on a fast host (AMX), where
        # the curve's floor holds, so the expected prices carry the floor too.
        joined_one = lone.costs.verify(3) - lone.costs.verify(2)
        assert lane.costs.verify(1) == pytest.approx(max(joined_one, 1e-6))
        joined = lone.costs.verify(6) - lone.costs.verify(2)  # the two others padded to 2 rows
        assert lane.costs.verify(2) == pytest.approx(max(min(lone.costs.verify(2), joined), 1e-6))
    finally:
        target.close()


def test_closing_and_cancelling_lanes_mid_answer_leaves_the_others_their_lone_answers(smollm2_q4_1: Path) -> None:
    # One lane's stream closed from another thread and another's asyncio task cancelled, both
    # mid-answer, while a third lane answers: it still gets its lone answer, the stopped lanes
    # no longer hold the passes up, and every lane answers again afterwards.
    import localspec

    ask = [{"role": "user", "content": "Count from one to thirty in words."}]
    with localspec.load_pool(
        str(smollm2_q4_1), parallel=3, n_ctx=TEST_N_CTX, threads=1, strategy="ngram", memory=False
    ) as pool:
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        alone = pool.runtimes[2].generate(messages=ask, max_tokens=48, temperature=0).text
        third: dict[str, str] = {}

        def answer_beside() -> None:
            third["text"] = pool.runtimes[2].generate(messages=ask, max_tokens=48, temperature=0).text

        got = close_and_cancel_mid_answer(pool, ask, read=5, ready=lambda: host.busy_lanes() >= 2, beside=answer_beside)
        assert got == {"closed": "cancelled", "task": "cancelled"} and third == {"text": alone}
        # Every lane answers again, its lone answer.
        again = [pool.runtimes[i].generate(messages=ask, max_tokens=48, temperature=0).text for i in range(3)]
        assert again == [alone] * 3
