"""Shared passes on a model with recurrent state (a Qwen3.5-style hybrid: Gated DeltaNet layers
beside attention): each lane keeps and takes back its own state, and every answer is the one
the request gets alone, greedy and seeded, with drafts accepted and rolled back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from model_support import TEST_N_CTX
from server_support import LANE_ASKS, asked_at_once, chat_answer, close_and_cancel_mid_answer

import localspec
from localspec.backends.llamacpp.copies import quantize
from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

ASKS = LANE_ASKS


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny hybrid target and a drafter close to it (its weights perturbed), so drafts are
    often accepted and, where they part, rolled back: inside llama.cpp's snapshots (4 tokens)
    and beyond them (a state copy, or the lane's tokens decoded again)."""
    folder = tmp_path_factory.mktemp("hybrid-lanes")
    # Q8_0: an F32 or F16 model's kernels keep only one-row passes exact, so its lanes would
    # take turns a row a pass; Q8_0's keep 63 rows.
    target = quantize(write_qwen35_gguf(HybridSpec(), folder / "hybrid-f32.gguf"), folder / "hybrid.gguf", "Q8_0")
    draft = write_qwen35_gguf(HybridSpec(noise=0.35), folder / "draft-f32.gguf")
    return target, quantize(draft, folder / "hybrid-draft.gguf", "Q8_0")


def test_a_hybrid_lanes_policy_prices_a_draft_as_the_pass_of_its_own_it_gets(hybrids: tuple[Path, Path]) -> None:
    """A hybrid's passes never pad a lane, so beside busy lanes a draft's block runs alone:
    its price is that pass, not the cheaper padded one a dense model's lane may take."""
    from localspec.control.costs import SharedPassCurve

    with localspec.load_pool(
        str(hybrids[0]), parallel=2, n_ctx=TEST_N_CTX, threads=1, strategy="ngram", memory=False
    ) as pool:
        costs = pool.runtimes[0].policy.costs  # type: ignore[attr-defined]
        assert isinstance(costs, SharedPassCurve) and not costs.pads


@pytest.mark.parametrize("strategy", ["draft", "ngram", "none"])
def test_a_hybrid_targets_lanes_give_each_answer_the_one_it_gets_alone(
    hybrids: tuple[Path, Path], strategy: str
) -> None:
    # n-gram's lanes keep no snapshots: its rejections go back from each lane's state copy.
    target, draft = hybrids
    more: dict[str, object] = {
        "draft": {"draft_model": str(draft), "draft_tokens": 6},
        "ngram": {"draft_tokens": 4},
        "none": {},
    }[strategy]
    asks = [(p, {"temperature": 0.0}) for p in ASKS]
    asks += [(p, {"temperature": 0.9, "seed": 5 + i}) for i, p in enumerate(ASKS)]
    with localspec.load_pool(
        str(target), parallel=3, n_ctx=TEST_N_CTX, threads=1, strategy=strategy, memory=False, **more
    ) as pool:
        assert len(pool.runtimes) == 3 and pool.note is None
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        # Every lane keeps recurrent state; only a draft model's lanes keep llama.cpp's snapshots.
        assert host.snapshots == (4 if strategy == "draft" else 0)
        alone = [
            pool.runtimes[0].generate(messages=[{"role": "user", "content": p}], max_tokens=32, **knobs)
            for p, knobs in asks
        ]
        shared, rollbacks = host.figures.shared_passes, host.figures.rollbacks
        together = asked_at_once(pool, asks)
        figures = host.figures
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert figures.shared_passes - shared > 10  # the lanes really shared passes
    assert figures.padded_rows == 0  # equal blocks only: padding would move a lane's state
    assert figures.rollbacks > rollbacks  # a lane's next prompt, and rejected drafts, took state back
    if strategy != "none":
        drafted = sum(r.stats.drafted for r in together)
        accepted = sum(r.stats.accepted for r in together)
        assert drafted > accepted > 0, (drafted, accepted)
        # Drafts were cut (inside the snapshots and beyond them, or from state copies alone),
        # and each lane drafted what it drafts alone.
        assert [r.stats.drafted for r in together] == [r.stats.drafted for r in alone]


def test_serve_batches_a_hybrid_targets_requests_over_http(hybrids: tuple[Path, Path]) -> None:
    # The server on a hybrid's pool: requests from three clients at once share passes and get
    # the answers they get alone.
    from localspec.server import LocalServer, Settings

    bodies = [
        {"model": "hybrid", "messages": [{"role": "user", "content": p}], "max_tokens": 24, **knobs}
        for p, knobs in zip(ASKS, [{"temperature": 0}, {"temperature": 0.8, "seed": 3}] * 3, strict=True)
    ]
    opts: dict[str, object] = {"n_ctx": TEST_N_CTX, "threads": 1, "strategy": "ngram", "memory": False}
    with localspec.load_pool(str(hybrids[0]), parallel=3, **opts) as pool:
        host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
        server = LocalServer(None, "hybrid", lambda _: pool, port=0, settings=Settings(log=lambda line: None))
        with server:
            server.start()
            assert server.wait_ready(120)
            alone = [chat_answer(server.url, body)["choices"][0]["message"]["content"] for body in bodies]
            shared = host.figures.shared_passes
            together: list[str] = [""] * len(bodies)

            def client(k: int) -> None:
                for i in range(k, len(bodies), 3):
                    together[i] = chat_answer(server.url, bodies[i])["choices"][0]["message"]["content"]

            threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
        assert together == alone
        assert host.figures.shared_passes > shared


def test_a_hybrid_lane_closed_or_cancelled_mid_answer_leaves_every_lane_its_lone_answer(
    hybrids: tuple[Path, Path],
) -> None:
    # One lane's stream closed from another thread and another's asyncio task cancelled, both
    # mid-answer, beside a third: the stopped lanes' states end wherever the cut fell, so their
    # next requests take them back, and every lane then answers as alone.
    ask = [{"role": "user", "content": ASKS[1]}]  # its answer runs to max_tokens (ASKS[0]'s stops at 8)
    opts: dict[str, object] = {"n_ctx": TEST_N_CTX, "threads": 1, "strategy": "ngram", "memory": False}
    with localspec.load_pool(str(hybrids[0]), parallel=3, **opts) as pool:
        alone = pool.runtimes[2].generate(messages=ask, max_tokens=24, temperature=0).text
        assert close_and_cancel_mid_answer(pool, ask, read=3) == {"closed": "cancelled", "task": "cancelled"}
        again = [pool.runtimes[i].generate(messages=ask, max_tokens=24, temperature=0).text for i in range(3)]
    assert again == [alone] * 3
