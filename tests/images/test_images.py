"""Images in, on llama.cpp through mtmd: a tiny vision pair written here (a llama-family target
and a LLaVA-style projector, random weights), run as users run it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_support import serving_runtimes

from localspec.api import Runtime, load
from localspec.cli.main import main
from localspec.core.errors import InvalidRequestError, LocalspecError, ModelLoadError
from localspec.server import LocalServer
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.vision_writer import ProjectorSpec, png_bytes, write_projector, write_vision_pair

N = 24  # tokens per answer: the tiny model's text repeats within it, so lookup drafts
OTHER = 3  # an image seed whose answer differs from seed 0's (the tiny model ignores most noise)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_vision_pair(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def seeing(pair: tuple[Path, Path]) -> Iterator[Runtime]:
    """A runtime whose cache outlives requests (prefix reuse), drafting with n-gram lookup."""
    runtime = load(str(pair[0]), mmproj=str(pair[1]), strategy="ngram", calibrate=False, n_ctx=256, threads=1)
    yield runtime
    runtime.close()


def fresh(pair: tuple[Path, Path], strategy: str) -> Runtime:
    return load(str(pair[0]), mmproj=str(pair[1]), strategy=strategy, calibrate=False, n_ctx=256, threads=1)


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat(image: dict[str, Any], text: str = "What is in the picture?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


def url_part(seed: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(png_bytes(24, 20, seed))}}


def answer(runtime: Runtime, messages: list[dict[str, Any]]) -> list[int]:
    return list(runtime.generate(messages=messages, max_tokens=N, temperature=0).tokens)


# -- speculation on image prompts is lossless -----------------------------------------------------


@pytest.mark.parametrize("seed", [0, OTHER])
def test_ngram_lookup_on_an_image_prompt_answers_as_plain_decoding(pair: tuple[Path, Path], seed: int) -> None:
    with fresh(pair, "none") as plain, fresh(pair, "ngram") as lookup:
        expected = answer(plain, chat(url_part(seed)))
        result = lookup.generate(messages=chat(url_part(seed)), max_tokens=N, temperature=0)
    assert list(result.tokens) == expected
    assert result.stats.drafted > 0  # lookup drafted on it: the identity is speculation's


def test_the_image_changes_the_answer(pair: tuple[Path, Path]) -> None:
    # Without this, the reuse tests below could not tell one image from another.
    with fresh(pair, "none") as plain:
        assert answer(plain, chat(url_part(0))) != answer(plain, chat(url_part(OTHER)))


# -- the cache: a prefix holding an image is reused for the same image only ------------------------


def test_a_cached_prefix_with_another_image_is_not_reused(pair: tuple[Path, Path], seeing: Runtime) -> None:
    answer(seeing, chat(url_part(0)))
    second = seeing.generate(messages=chat(url_part(OTHER)), max_tokens=N, temperature=0)
    with fresh(pair, "none") as plain:
        assert list(second.tokens) == answer(plain, chat(url_part(OTHER)))
    prompt = seeing.prepare(messages=chat(url_part(OTHER))).ids
    first_image_position = next(i for i, t in enumerate(prompt) if t < 0)
    # Everything from the image on was evaluated again; the text before it was reused.
    assert second.stats.prefill_tokens == len(prompt) - first_image_position


def test_a_cached_prefix_with_the_same_image_is_reused(seeing: Runtime) -> None:
    first = chat(url_part(2))
    answer(seeing, first)
    follow_up = [*first, {"role": "assistant", "content": "A picture."}, {"role": "user", "content": "More?"}]
    result = seeing.generate(messages=follow_up, max_tokens=N, temperature=0)
    prompt = seeing.prepare(messages=follow_up).ids
    last_image_position = max(i for i, t in enumerate(prompt) if t < 0)
    assert result.stats.prefill_tokens < len(prompt) - last_image_position


def test_an_image_given_by_path_is_the_same_image_as_its_data_url(tmp_path: Path, seeing: Runtime) -> None:
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(24, 20, 2))
    assert answer(seeing, chat({"type": "image", "path": str(path)})) == answer(seeing, chat(url_part(2)))


# -- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (png_bytes(24, 20)[:60], "truncated or corrupt"),
        (b"GIF? no, plain text", "not an image"),
        (b"", "not an image"),
    ],
)
def test_a_bad_image_is_refused_and_the_runtime_still_answers(seeing: Runtime, data: bytes, said: str) -> None:
    with pytest.raises(InvalidRequestError, match=said) as refused:
        seeing.generate(messages=chat({"type": "image_url", "image_url": {"url": data_url(data)}}), max_tokens=4)
    assert refused.value.hint and "PNG" in refused.value.hint
    assert len(answer(seeing, chat(url_part(0)))) == N


def test_a_remote_url_is_refused_saying_why(seeing: Runtime) -> None:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(InvalidRequestError, match="does not fetch images from URLs") as refused:
        seeing.generate(messages=chat(part), max_tokens=4)
    assert "data URL" in str(refused.value.hint)


def test_an_image_sent_to_a_model_loaded_without_a_projector_names_mmproj(pair: tuple[Path, Path]) -> None:
    text_only = load(str(pair[0]), strategy="none", calibrate=False, n_ctx=256, threads=1)
    with text_only, pytest.raises(InvalidRequestError, match="reads text only") as refused:
        text_only.generate(messages=chat(url_part(0)), max_tokens=4)
    assert "--mmproj" in str(refused.value.hint) or "mmproj=" in str(refused.value.hint)


def test_a_projector_of_another_width_is_refused_at_load(tmp_path: Path) -> None:
    target = write_gguf(Spec(arch="llama"), tmp_path / "target.gguf")
    wrong = write_projector(ProjectorSpec(out_width=48), tmp_path / "mmproj-48.gguf")
    with pytest.raises(ModelLoadError, match="could not load the projector") as refused:
        load(str(target), mmproj=str(wrong), strategy="none", calibrate=False, n_ctx=256, threads=1)
    assert "64 wide" in str(refused.value.hint)


def test_images_are_refused_on_a_backend_that_reads_text_only() -> None:
    with pytest.raises(LocalspecError, match=r"llama\.cpp backend only"):
        load("tiny", backend="reference", mmproj="mmproj.gguf")


# -- the command line -------------------------------------------------------------------------------


def test_run_with_an_image_answers(pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes(24, 20))
    args = ["run", "What is it?", "-m", str(pair[0]), "--mmproj", str(pair[1]), "--image", str(image)]
    code = main([*args, "-t", "0", "-n", "8", "--json", "--ctx", "256", "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"generated_tokens": 8' in out


def test_run_with_an_image_but_no_projector_names_the_fix(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes(24, 20))
    assert main(["run", "What is it?", "-m", str(pair[0]), "--image", str(image), "-n", "4", "--ctx", "256"]) == 2
    err = capsys.readouterr().err
    assert "reads text only" in err and "--mmproj FILE" in err and "Traceback" not in err


def test_run_with_a_missing_image_is_refused_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "What is it?", "-m", "nowhere.gguf", "--image", "nowhere.png"]) == 2
    assert "cannot read the image nowhere.png" in capsys.readouterr().err


# -- serve ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(pair: tuple[Path, Path]) -> Iterator[LocalServer]:
    with serving_runtimes(lambda: fresh(pair, "ngram"), "tiny-vision") as srv:
        yield srv


def test_serve_takes_an_image_url_data_url_from_the_openai_client(pair: tuple[Path, Path], server: LocalServer) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="tiny-vision",
        messages=chat(url_part(OTHER)),
        max_tokens=N,
        temperature=0,  # type: ignore[arg-type]
    )
    with fresh(pair, "none") as plain:
        expected = plain.generate(messages=chat(url_part(OTHER)), max_tokens=N, temperature=0).text
    assert reply.choices[0].message.content == expected


def test_serve_refuses_a_remote_image_url_with_400_saying_why(server: LocalServer) -> None:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = {"model": "tiny-vision", "messages": chat(part), "max_tokens": 4}
    reply = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert "not fetched" in error["message"] and "data URL" in error["message"]
    assert error["param"] == "messages[0].content[0].image_url.url"


def test_serve_refuses_a_corrupt_image_with_400(server: LocalServer) -> None:
    part = {"type": "image_url", "image_url": {"url": data_url(png_bytes(24, 20)[:60])}}
    reply = httpx.post(
        f"{server.url}/chat/completions", json={"model": "tiny-vision", "messages": chat(part)}, timeout=30
    )
    assert reply.status_code == 400
    assert "truncated or corrupt" in reply.json()["error"]["message"]
