"""serve --parallel with images: each lane evaluates its prompt's images into its own
sequence, an image's rows in a pass of their own, so an answer about an image is the one the
request gets alone, drafted for by n-gram lookup or by a draft model's lanes. The tiny vision
pair (a Q8_0 target, so passes hold up to 63 rows and are shared), a real server, four real
HTTP clients."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from server_support import chat_answer

from localspec.backends.llamacpp.copies import derived
from localspec.pool import Pool, load_pool
from localspec.server import LocalServer, Settings
from localspec.testing.vision_writer import png_bytes, write_vision_pair

MODEL = "tiny-vision"
SEEDS = (0, 3, 5)  # images whose answers differ: a lane reading another's image would show


@pytest.fixture(scope="module", params=["ngram", "draft", "eagle3", "dflash"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalServer, Pool]]:
    """n-gram lookup; a draft model (the F32 original, reading the prompt's text alone) with
    lanes of its own; or a drafter reading the target's layers (an EAGLE-3 head, a DFlash
    drafter), a context per lane, which sees the image through the target's rows. Drafters
    draft 3 tokens a step."""
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
    from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
    from localspec.testing.gguf_writer import Spec

    folder = tmp_path_factory.mktemp("vision-lanes")
    target, projector = write_vision_pair(folder)
    quantized = derived(target, "Q8_0", folder)  # an F32 model's lanes take one row a pass
    files = {
        "draft": lambda: target,
        "eagle3": lambda: write_eagle3_gguf(Spec(arch="llama"), HeadSpec(), folder / "eagle3.gguf"),
        "dflash": lambda: write_dflash_gguf(target, folder / "dflash.gguf", DFlashSpec(target_layers=(1, 2))),
    }
    drafter = files[request.param]() if request.param in files else None
    drafting: dict[str, Any] = {"draft_model": str(drafter), "draft_tokens": 3} if drafter is not None else {}
    pool = load_pool(
        str(quantized),
        mmproj=str(projector),
        parallel=4,
        strategy=request.param,
        calibrate=False,
        n_ctx=256,
        threads=1,
        **drafting,
    )
    server = LocalServer(None, MODEL, lambda _: pool, port=0, settings=Settings(log=lambda line: None))
    with server:
        server.start()
        assert server.wait_ready(120)
        yield server, pool


def _image(seed: int) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(24, 20, seed)).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def _bodies() -> list[dict[str, Any]]:
    asks: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": [_image(seed), {"type": "text", "text": "What is in the picture?"}]}]
        for seed in SEEDS
    ]
    asks.append([{"role": "user", "content": "Describe a picture you like."}])  # text beside the images
    knobs: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 0.9, "seed": 7}]
    return [{"model": MODEL, "messages": m, "max_tokens": 48, **k} for m in asks for k in knobs]


def _from_four_clients(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each body's answer, asked by four clients that send each round of requests together."""
    together: list[dict[str, Any]] = [{} for _ in bodies]
    start = threading.Barrier(4)

    def client(k: int) -> None:
        for i in range(k, len(bodies), 4):
            start.wait(60)
            together[i] = chat_answer(url, bodies[i])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return together


def test_answers_about_images_are_the_same_alone_and_from_four_concurrent_clients(
    served: tuple[LocalServer, Pool],
) -> None:
    server, pool = served
    assert len(pool.runtimes) == 4 and pool.note is None
    host = pool.runtimes[0].target.host  # type: ignore[attr-defined]
    bodies = _bodies()
    answers = [chat_answer(server.url, body) for body in bodies]
    alone = [answer["choices"][0]["message"]["content"] for answer in answers]
    assert len({alone[2 * i] for i in range(len(SEEDS))}) == len(SEEDS)  # each image its own answer
    # The tiny model answers in milliseconds: a round may pass without two requests meeting in
    # a pass on a busy host, so rounds run (each answer checked) until the lanes have shared one.
    for _ in range(3):
        shared_before = host.figures.shared_passes
        together = _from_four_clients(server.url, bodies)
        assert [answer["choices"][0]["message"]["content"] for answer in together] == alone
        if host.figures.shared_passes > shared_before:
            break
    assert host.figures.shared_passes > shared_before  # the lanes' steps really shared passes
    drafted = sum(answer["speculation"]["drafted_tokens"] for answer in together)
    accepted = sum(answer["speculation"]["accepted_tokens"] for answer in together)
    assert drafted > accepted > 0  # drafts were taken, and some rolled back

    def counts(given: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(a["speculation"]["drafted_tokens"], a["speculation"]["accepted_tokens"]) for a in given]

    if pool.runtimes[0].label != "ngram":  # a fixed draft length: each lane drafted what it drafts alone
        assert counts(together) == counts(answers)  # (n-gram's lengths are priced beside the busy lanes)


@pytest.mark.parametrize("writer", ["grid", "pooled"])
def test_a_projector_lanes_do_not_place_yet_serves_one_request_at_a_time_and_says_why(
    writer: str, tmp_path: Any
) -> None:
    # M-RoPE's grid (Qwen-VL) and Gemma 3's whole-image attention place rows that a lane's
    # linear positions would not: the pool falls back to one runtime instead of failing.
    from localspec.testing.vision_writer import write_grid_pair, write_pooled_pair

    target, projector = (write_grid_pair if writer == "grid" else write_pooled_pair)(tmp_path)
    quantized = derived(target, "Q8_0", tmp_path)
    with load_pool(
        str(quantized), mmproj=str(projector), parallel=2, strategy="ngram", calibrate=False, n_ctx=256, threads=1
    ) as pool:
        assert len(pool.runtimes) == 1
        assert pool.note is not None and "one request runs at a time" in pool.note
        assert ("M-RoPE" if writer == "grid" else "whole") in pool.note
        image = {"type": "image", "data": png_bytes(24, 20, 3)}
        answer = pool.generate(
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}], max_tokens=4
        )
        assert answer.stats.generated_tokens > 0
