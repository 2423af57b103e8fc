"""Shared passes with heads that read the target's hidden states: the model's own MTP head
(Qwen3.5/3.6's nextn block, `auto` on a GGUF that ships one) and an EAGLE-3 head. Each lane's
head reads that lane's rows, copied out of the shared passes, and every answer is the one the
request gets alone.

The heads here guess from the state they are given (HybridSpec.mtp_echo_state; an EAGLE-3 head
whose fc weighs the target's layers as much as the token), so a lane whose head read another
lane's row, or the pass's first rows, drafts differently from a lone runtime: the draft and
acceptance counts below would part (they did when the rows were taken from the pass's start),
though the answers, which the target verifies, would not."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from model_support import TEST_N_CTX
from server_support import LANE_ASKS, asked_at_once, close_and_cancel_mid_answer

import localspec
from localspec import Completion, Runtime
from localspec.backends.llamacpp import compute
from localspec.backends.llamacpp.copies import quantize
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

ASKS = LANE_ASKS
KNOBS: list[dict[str, object]] = [{"temperature": 0.0}] * 6 + [{"temperature": 0.9, "seed": 5 + i} for i in range(6)]


@pytest.fixture(scope="module")
def with_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Q8_0 hybrid with an MTP block that guesses from the state it reads (module doc)."""
    folder = tmp_path_factory.mktemp("mtp-lanes")
    f32 = write_qwen35_gguf(HybridSpec(nextn=1, mtp_echo=1.0, mtp_echo_state=True), folder / "mtp-f32.gguf")
    return quantize(f32, folder / "mtp.gguf", "Q8_0")


@pytest.fixture
def where(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each drafter pass (llama_process) runs on, in order."""
    threads: list[str] = []
    process = compute._process

    def recorded(ctx: object, kind: int, batch: object) -> int:
        threads.append(threading.current_thread().name)
        return process(ctx, kind, batch)

    monkeypatch.setattr(compute, "_process", recorded)
    return threads


def _chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def _counts(answers: list[Completion]) -> list[tuple[int, int]]:
    return [(a.stats.drafted, a.stats.accepted) for a in answers]


def _asked(runtime: Runtime) -> list[Completion]:
    return [runtime.generate(messages=_chat(ASKS[i % 6]), max_tokens=32, **KNOBS[i]) for i in range(12)]  # type: ignore[arg-type]


def assert_lanes_draft_as_alone(
    target: Path, opts: dict[str, object], label: str, weights: int, merged: bool = False
) -> None:
    """12 answers (greedy and seeded) from a lone runtime, then from one lane of three, then
    from three clients at once: the same tokens, and the same draft and acceptance counts
    (the module doc says why those); weights: the drafter files the lanes' host loaded;
    merged: the lanes' drafters (heads, assistants) drafted in passes shared between lanes too."""
    with localspec.load(model=str(target), n_ctx=TEST_N_CTX // 3, **opts) as single:
        lone = _asked(single)
    with localspec.load_pool(str(target), parallel=3, n_ctx=TEST_N_CTX, **opts) as pool:
        assert len(pool.runtimes) == 3 and pool.note is None
        assert {runtime.label for runtime in pool.runtimes} == {label}
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        assert len(host._head_models) == weights  # a file's weights once, for every lane's drafter
        alone = _asked(pool.runtimes[1])
        shared = host.figures.shared_passes
        drafted_together = _merged_passes(host)
        together = asked_at_once(pool, [(ASKS[i % 6], KNOBS[i]) for i in range(12)])
        if host.model.capabilities.device == "cpu":  # a device's passes hold what its load check found: few rows
            assert host.figures.shared_passes - shared > 10  # the lanes really shared passes
            assert (_merged_passes(host) - drafted_together > 10) == merged
    drafted, accepted = sum(d for d, _ in _counts(lone)), sum(a for _, a in _counts(lone))
    assert drafted > accepted > 0, (drafted, accepted)
    for answers in (alone, together):
        assert [a.tokens for a in answers] == [a.tokens for a in lone]
        # The drafters read the right rows: a lone runtime's drafts, kept and cut alike.
        assert _counts(answers) == _counts(lone)


def _merged_passes(host: Any) -> int:
    """The drafter passes that held more than one lane's rows (head_passes.py)."""
    return sum(passes.figures.merged for passes in host._merged.values())


def test_each_lanes_mtp_head_drafts_what_a_lone_runtimes_head_drafts(with_head: Path) -> None:
    opts: dict[str, object] = {"threads": 1, "strategy": "mtp", "draft_tokens": 4, "memory": False}
    # The model's own block: no file's weights; the lanes' blocks draft in merged passes.
    assert_lanes_draft_as_alone(with_head, opts, "mtp", weights=0, merged=True)


def test_auto_serves_a_gguf_with_an_mtp_head_in_lanes_its_head_passes_on_the_compute_thread(
    with_head: Path, where: list[str]
) -> None:
    # `auto` on such a GGUF drafts with its head (calibrated, as users run it), and the pool
    # no longer falls back to one request at a time. At 2 threads a lane's head passes run on
    # the compute thread even where the process runs its passes in place (`serve`), so the
    # requests' threads keep no OpenMP teams of their own.
    with compute.in_place(), localspec.load_pool(str(with_head), parallel=2, n_ctx=TEST_N_CTX, threads=2) as pool:
        assert pool.note is None and [runtime.label for runtime in pool.runtimes] == ["mtp", "mtp"]
        alone = [pool.runtimes[0].generate(messages=_chat(p), max_tokens=24, temperature=0).tokens for p in ASKS[:4]]
        out: list[list[int]] = [[] for _ in range(4)]

        def client(k: int) -> None:
            for i in range(k, 4, 2):
                out[i] = pool.generate(messages=_chat(ASKS[i]), max_tokens=24, temperature=0).tokens

        threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert out == alone
    assert where and all(name.startswith("localspec-compute") for name in where), set(where)


def test_a_hybrid_targets_lanes_feed_their_dflash_drafters_across_recurrent_rollback(tmp_path: Path) -> None:
    # A hybrid's lane takes a rejected block back from its snapshots or a copy of its state and
    # decodes the kept tokens again: the rows those passes write are its drafter's too.
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf

    f32 = write_qwen35_gguf(HybridSpec(), tmp_path / "hybrid-f32.gguf")
    target = quantize(f32, tmp_path / "hybrid.gguf", "Q8_0")
    drafter = write_dflash_gguf(f32, tmp_path / "dflash.gguf", DFlashSpec(target_layers=(1, 3), focus=0.5))
    opts: dict[str, object] = {"threads": 1, "strategy": "dflash", "draft_model": str(drafter), "draft_tokens": 6}
    assert_lanes_draft_as_alone(target, opts | {"memory": False}, "dflash", weights=1)


EAGLE3_TARGET = Spec("llama", mix=0.02, head=1.0)  # close to a bigram model (test_llamacpp_eagle3.py's)


@pytest.fixture(scope="module")
def eagle3_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Q8_0 near-bigram target (63 rows a pass stay exact, so lanes share passes) and a Q8_0
    EAGLE-3 head whose guesses follow the target's layers it reads (fc=3.0), so that the lanes'
    heads share passes too (an F32 head's rows part from one-token passes from 2 rows)."""
    folder = tmp_path_factory.mktemp("eagle3-lanes")
    target = quantize(write_gguf(EAGLE3_TARGET, folder / "target-f32.gguf"), folder / "target.gguf", "Q8_0")
    head = write_eagle3_gguf(EAGLE3_TARGET, HeadSpec(fc=3.0), folder / "eagle3-f32.gguf")
    return target, quantize(head, folder / "eagle3.gguf", "Q8_0")


def test_each_lanes_eagle3_head_drafts_what_a_lone_runtimes_head_drafts(eagle3_pair: tuple[Path, Path]) -> None:
    target, head = eagle3_pair
    opts: dict[str, object] = {"threads": 1, "strategy": "eagle3", "draft_model": str(head), "draft_tokens": 4}
    # The lanes' heads draft in one context, their rows in merged passes.
    assert_lanes_draft_as_alone(target, opts | {"memory": False}, "eagle3", weights=1, merged=True)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_each_lanes_block_drafter_drafts_what_a_lone_runtimes_drafts(kind: str, tmp_path: Path) -> None:
    # Each lane's DFlash or DSpark drafter injects that lane's layer inputs into its stream of
    # the drafters' one context, and the lanes' blocks share passes (a Q8_0 drafter: an F32
    # one's rows part from one-token passes from 2 rows); the weights are loaded once. Its
    # guesses carry the injected features (dflash_support: focus), so a lane fed another
    # lane's rows, or reading another lane's block, drafts otherwise than alone.
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
    from localspec.testing.dspark_support import DSparkSpec, write_dspark_gguf

    dense = Spec("llama", embed_scale=0.05, seed=1)  # runs of one token, as test_llamacpp_dflash.py's
    f32 = write_gguf(dense, tmp_path / "f32.gguf")
    target = quantize(f32, tmp_path / "target.gguf", "Q8_0")
    if kind == "dflash":
        # focus 0.5: the anchor weighs less against the injected features than its default
        drafter = write_dflash_gguf(f32, tmp_path / "dflash-f32.gguf", DFlashSpec(target_layers=(1, 2), focus=0.5))
    else:
        spec = DSparkSpec(backbone=DFlashSpec(target_layers=(1, 2), focus=0.5))
        drafter = write_dspark_gguf(f32, tmp_path / "dspark-f32.gguf", spec)
    drafter = quantize(drafter, tmp_path / f"{kind}.gguf", "Q8_0")
    opts: dict[str, object] = {"threads": 1, "strategy": kind, "draft_model": str(drafter), "draft_tokens": 4}
    assert_lanes_draft_as_alone(target, opts | {"memory": False}, kind, weights=1, merged=True)


def test_a_block_drafter_whose_block_outgrows_the_lanes_drafter_pass_keeps_a_context_a_lane(tmp_path: Path) -> None:
    # The lanes' blocks share the drafter's context, whose ubatch must hold a whole block (a
    # block attends to itself whole): a drafter of 80-token blocks drafts in a context of its
    # own a lane instead, and each lane answers and drafts as alone.
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf

    f32 = write_gguf(Spec("llama", embed_scale=0.05, seed=1), tmp_path / "target.gguf")
    drafter = write_dflash_gguf(f32, tmp_path / "dflash.gguf", DFlashSpec(block_size=80, focus=0.5))
    opts: dict[str, object] = {"strategy": "dflash", "draft_model": str(drafter), "draft_tokens": 4, "threads": 1}
    asks = [(ASKS[i], {"temperature": 0.0}) for i in range(4)]
    with localspec.load(model=str(f32), n_ctx=TEST_N_CTX // 2, memory=False, **opts) as single:
        lone = [single.generate(messages=_chat(prompt), max_tokens=16, **knobs) for prompt, knobs in asks]
    with localspec.load_pool(str(f32), parallel=2, n_ctx=TEST_N_CTX, memory=False, **opts) as pool:
        assert pool.note is None and pool.runtimes[0].target.host._merged == {}  # type: ignore[attr-defined]
        together = asked_at_once(pool, asks, max_tokens=16)
    assert sum(a.stats.drafted for a in lone) > 0
    assert [a.tokens for a in together] == [a.tokens for a in lone]
    assert _counts(together) == _counts(lone)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_lanes_drafter_runs_every_pass_on_the_compute_thread_from_its_load_on(
    kind: str, eagle3_pair: tuple[Path, Path], tmp_path: Path, where: list[str]
) -> None:
    # At 2 threads, in place as `serve` runs: an EAGLE-3 head's fc passes and a DFlash
    # drafter's passes (its timing pass at load among them) run on the compute thread, so
    # neither the loading thread nor a request's keeps an OpenMP team of its own.
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf

    target, head = eagle3_pair
    if kind == "dflash":
        f32 = write_gguf(EAGLE3_TARGET, tmp_path / "f32.gguf")
        head = write_dflash_gguf(f32, tmp_path / "dflash.gguf", DFlashSpec(target_layers=(1, 2)))
    opts: dict[str, object] = {"threads": 2, "strategy": kind, "draft_model": str(head), "draft_tokens": 3}
    with compute.in_place(), localspec.load_pool(str(target), parallel=2, n_ctx=TEST_N_CTX, **opts) as pool:
        asked_at_once(pool, [(p, {"temperature": 0.0}) for p in ASKS[:4]], max_tokens=16)
    assert where and all(name.startswith("localspec-compute") for name in where), set(where)


@pytest.fixture(scope="module")
def gemma4_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Q8_0 tiny Gemma 4 target and its assistant, which reads the target's KV cache in place
    and guesses its input token again, tilted by what its attention reads there (at 3.0 its
    counts part from an assistant that reads nothing)."""
    from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

    folder = tmp_path_factory.mktemp("gemma4-lanes")
    f32, assistant = write_gemma4_pair(Gemma4Spec(echo=True, seed=1, head_scale=8.0, echo_attention=3.0), folder)
    return quantize(f32, folder / "gemma4-q8.gguf", "Q8_0"), assistant


def test_each_lanes_gemma4_assistant_drafts_what_a_lone_runtimes_drafts(gemma4_pair: tuple[Path, Path]) -> None:
    # Each lane's assistant has a context with a sequence for every lane, so llama.cpp maps
    # the lane's sequence to the lane's own stream of the target's cache (lanes.py). One that
    # read lane 0's stream, or the next lane's, for every lane failed here.
    target, assistant = gemma4_pair
    opts: dict[str, object] = {"threads": 1, "strategy": "mtp", "draft_model": str(assistant), "draft_tokens": 4}
    assert_lanes_draft_as_alone(target, opts | {"memory": False}, "mtp", weights=1, merged=True)


def test_serve_answers_a_gemma4_pairs_side_request_beside_a_stream(gemma4_pair: tuple[Path, Path]) -> None:
    # The chat front end: a title request sent with a long answer, over real HTTP, to a
    # Gemma 4 pair drafting with its assistant: both decode in shared passes, each its lone answer.
    from server_support import chat_answer

    from localspec.core.options import LoadOptions
    from localspec.server import LocalServer, Settings

    target, assistant = gemma4_pair
    opts = LoadOptions(model=str(target), draft_model=str(assistant), n_ctx=TEST_N_CTX, threads=1, memory=False)
    asks = [(ASKS[4], 400), (ASKS[1], 12)]  # the long answer runs until its lane's context is full
    with localspec.load_pool(opts, parallel=2) as pool:
        assert pool.note is None and [rt.label for rt in pool.runtimes] == ["mtp", "mtp"]
        alone = [pool.generate(messages=_chat(p), max_tokens=n, temperature=0).text for p, n in asks]
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        shared = host.figures.shared_passes
        # The first request to reach a pass (either one) waits from its second ask on, until the
        # other has a lane too: so the two overlap on any host, however fast the tiny pair answers
        # alone. A lane counts as busy from its first ask: held before it, the other request runs
        # its passes alone and may end between two looks at busy_lanes().
        evaluate, met, asked = host.evaluate, threading.Event(), []

        def overlapping(lane: Any, *args: Any) -> Any:
            asked.append(lane.seq)
            deadline = time.monotonic() + 60
            held = lane.seq == asked[0] and asked.count(lane.seq) > 1
            while held and not met.is_set() and time.monotonic() < deadline:
                if host.busy_lanes() >= 2:
                    met.set()
                time.sleep(0.002)
            return evaluate(lane, *args)

        host.evaluate = overlapping
        server = LocalServer(None, "g", lambda _: pool, port=0, settings=Settings(log=lambda line: None))
        together = [""] * len(asks)

        def client(i: int) -> None:
            body = {"model": "g", "messages": _chat(asks[i][0]), "max_tokens": asks[i][1], "temperature": 0}
            together[i] = chat_answer(server.url, body)["choices"][0]["message"]["content"]

        with server:
            server.start()
            assert server.wait_ready(120)
            threads = [threading.Thread(target=client, args=(i,)) for i in range(len(asks))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
        assert met.is_set() and host.figures.shared_passes > shared  # the title decoded beside the answer
    assert together == alone


@pytest.mark.parametrize("kind", ["mtp", "assistant", "eagle3", "dflash"])
def test_a_lane_closed_or_cancelled_mid_answer_leaves_every_lane_its_lone_answer(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Lane 0's stream closed from another thread and lane 1's asyncio task cancelled while
    # they draft: every lane's drafter then drafts its lone answer and counts again.
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf

    opts: dict[str, object] = {"threads": 1, "strategy": kind, "draft_tokens": 4, "memory": False}
    if kind == "mtp":
        target = request.getfixturevalue("with_head")
    elif kind == "assistant":
        target, opts["draft_model"] = request.getfixturevalue("gemma4_pair")
        opts["strategy"] = "mtp"
    else:  # a target whose answer runs on (the near-bigram one ends within 6 tokens)
        dense = Spec("llama", embed_scale=0.05, seed=1)
        f32 = write_gguf(dense, tmp_path / "f32.gguf")
        target = quantize(f32, tmp_path / "target.gguf", "Q8_0")
        if kind == "eagle3":
            drafter = write_eagle3_gguf(dense, HeadSpec(fc=3.0), tmp_path / "drafter-f32.gguf")
        else:
            drafter = write_dflash_gguf(f32, tmp_path / "drafter-f32.gguf", DFlashSpec(target_layers=(1, 2)))
        # Q8_0: the lanes' drafters share passes, which a closed or cancelled lane leaves mid-way.
        opts["draft_model"] = str(quantize(drafter, tmp_path / f"{kind}.gguf", "Q8_0"))
    opts["draft_model"] = str(opts["draft_model"]) if "draft_model" in opts else None
    ask = _chat(ASKS[4])  # its answer runs until the lane's context is full: far past the stops
    with localspec.load_pool(str(target), parallel=3, n_ctx=TEST_N_CTX, **opts) as pool:
        alone = pool.runtimes[2].generate(messages=ask, max_tokens=24, temperature=0)
        assert close_and_cancel_mid_answer(pool, ask, read=3) == {"closed": "cancelled", "task": "cancelled"}
        again = [pool.runtimes[i].generate(messages=ask, max_tokens=24, temperature=0) for i in range(3)]
    assert alone.stats.drafted > 0
    assert [a.tokens for a in again] == [alone.tokens] * 3
    assert _counts(again) == [_counts([alone])[0]] * 3


@pytest.mark.parametrize("kind", ["mtp", "eagle3", "dflash"])
def test_the_lanes_memory_estimate_covers_what_llama_cpp_reserves_for_a_lanes_drafter(
    kind: str, with_head: Path, eagle3_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # serve's default lanes come from this estimate (backends/llamacpp/lane_memory.py), made
    # from the headers before anything loads; llama.cpp's log says what a lane really took, its
    # drafter's context included, once every lane has caught up on a long prompt. A drafter's
    # context sized at the target's 512-row ubatch took several times the estimate.
    from localspec.core.options import LoadOptions
    from localspec.pool import lane_estimate
    from localspec.testing.dflash_support import write_dflash_gguf
    from localspec.testing.lane_buffers import MIB, lane_reserved

    target, drafter = eagle3_pair
    if kind == "mtp":
        target, drafter = with_head, None
    elif kind == "dflash":
        drafter = write_dflash_gguf(write_gguf(EAGLE3_TARGET, tmp_path / "f32.gguf"), tmp_path / "dflash.gguf")
    opts = {"strategy": kind, "n_ctx": TEST_N_CTX, "draft_model": str(drafter) if drafter else None}
    # Prompts of about 160 tokens, inside a lane's 256: a catch-up of several of a drafter's 64-row ubatches.
    long, other = " ".join(ASKS), " ".join(reversed(ASKS))
    measured = lane_reserved(str(target), [long, other], **opts, threads=1, draft_tokens=3)
    estimate = lane_estimate(LoadOptions.of(model=str(target), **opts))
    # llama.cpp's log gives each buffer to 0.01 MiB: on these tiny models a lane's share of that
    # rounding is a few KiB (on Mesa's software device the MTP lane read 1 KiB over its estimate).
    rounding = 0.01 * MIB
    assert measured - rounding <= estimate <= 2.5 * measured, (measured, estimate)


@pytest.mark.parametrize("kind", ["mtp", "assistant"])
def test_sampling_in_lanes_whose_heads_share_passes_keeps_the_targets_joint_law(
    kind: str, with_head: Path, gemma4_pair: tuple[Path, Path]
) -> None:
    # The heads that draft in merged passes (head_passes.py): 600 seeded runs spread over three
    # lanes asking at once, their first two tokens against the target's exact joint law.
    from test_llamacpp_sampling import (
        P_FLOOR,
        SAMPLING,
        Samples,
        chi_square_p_value,
        exact_first_two,
        first_two,
        worst_cells,
    )

    from localspec.core.sampling import SamplingConfig

    target, drafter = (with_head, None) if kind == "mtp" else gemma4_pair
    prompt = "the world and the world and the"
    with localspec.load(model=str(target), n_ctx=256, strategy="none") as plain:
        start = plain.prompt_tokens(prompt)
        context = start + plain.generate(prompt=start, max_tokens=30, temperature=0).tokens
        law = exact_first_two(plain.target, context, SamplingConfig(**SAMPLING))
    opts: dict[str, object] = {"strategy": "mtp", "draft_tokens": 2, "calibrate": False, "memory": False}
    opts |= {"draft_model": str(drafter)} if drafter is not None else {}
    per_lane = [Samples() for _ in range(3)]
    with localspec.load_pool(str(target), parallel=3, n_ctx=3 * 256, threads=1, **opts) as pool:

        def lane(k: int) -> None:
            for seed in range(k, 600, 3):
                pair, first_step = first_two(pool.runtimes[k], context, seed)  # type: ignore[arg-type]
                per_lane[k].counts[pair] += 1
                per_lane[k].cut_drafts += first_step < 3

        threads = [threading.Thread(target=lane, args=(k,)) for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        # Where a pass may hold two lanes' rows: a device whose load check keeps one row a pass
        # (Mesa's software device, for the MTP block) runs each lane's alone.
        if all(passes._rows > 1 for passes in host._merged.values()):
            assert _merged_passes(host) > 10
    counts = sum((s.counts for s in per_lane), Counter())
    assert sum(counts.values()) == 600 and sum(s.cut_drafts for s in per_lane) > 0
    p = chi_square_p_value(counts, law)
    assert p > P_FLOOR, worst_cells(counts, law)
