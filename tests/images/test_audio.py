"""Audio in, on llama.cpp through mtmd, the path images take: a tiny audio pair written here (a
llama-family target and a Qwen2-Audio-style "qwen2a" projector, random weights), sent
OpenAI's input_audio parts as users send them."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_support import serving_runtimes

from localspec.api import Runtime, load
from localspec.core.errors import InvalidRequestError
from localspec.server import LocalServer
from localspec.testing.audio_writer import AudioSpec, wav_bytes, write_audio_pair, write_vision_projector_beside
from localspec.testing.gguf_writer import Spec

N = 16  # tokens per answer
N_CTX = 1024  # a clip takes 750 positions (one 30 s window)
TARGET = Spec(arch="llama", n_ctx=N_CTX)
PITCH, OTHER_PITCH = 440.0, 880.0  # two clips the tiny pair answers differently


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_audio_pair(tmp_path_factory.mktemp("audio"), TARGET, AudioSpec(out_width=TARGET.hidden))


@pytest.fixture(scope="module")
def hearing(pair: tuple[Path, Path]) -> Iterator[Runtime]:
    with fresh(pair, "ngram") as runtime:
        yield runtime


def fresh(pair: tuple[Path, Path], strategy: str, mmproj: Path | None = None) -> Runtime:
    projector = str(mmproj or pair[1])
    return load(str(pair[0]), mmproj=projector, strategy=strategy, calibrate=False, n_ctx=N_CTX, threads=1)


def audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def chat(part: dict[str, Any], text: str = "What is said?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [part, {"type": "text", "text": text}]}]


def answer(runtime: Runtime, messages: list[dict[str, Any]]) -> list[int]:
    return list(runtime.generate(messages=messages, max_tokens=N, temperature=0).tokens)


# -- the clip is read, and speculation on it stays exact ----------------------------------------


def test_the_clip_changes_the_answer(pair: tuple[Path, Path]) -> None:
    with fresh(pair, "none") as plain:
        assert answer(plain, chat(audio_part(wav_bytes(pitch=PITCH)))) != answer(
            plain, chat(audio_part(wav_bytes(pitch=OTHER_PITCH)))
        )


def test_a_clip_takes_its_projector_positions_as_placeholders(hearing: Runtime) -> None:
    ids = hearing.prepare(messages=chat(audio_part(wav_bytes()))).ids
    assert sum(1 for t in ids if t < 0) == AudioSpec().positions


@pytest.mark.parametrize("pitch", [PITCH, OTHER_PITCH])
def test_ngram_lookup_on_an_audio_prompt_answers_as_plain_decoding(pair: tuple[Path, Path], pitch: float) -> None:
    messages = chat(audio_part(wav_bytes(pitch=pitch)))
    with fresh(pair, "none") as plain, fresh(pair, "ngram") as lookup:
        expected = answer(plain, messages)
        result = lookup.generate(messages=messages, max_tokens=N, temperature=0)
    assert list(result.tokens) == expected
    assert result.stats.drafted > 0  # lookup drafted on it: the identity is speculation's


def test_a_cached_prefix_with_another_clip_is_not_reused(pair: tuple[Path, Path], hearing: Runtime) -> None:
    answer(hearing, chat(audio_part(wav_bytes(pitch=PITCH))))
    second = answer(hearing, chat(audio_part(wav_bytes(pitch=OTHER_PITCH))))
    with fresh(pair, "none") as plain:
        assert second == answer(plain, chat(audio_part(wav_bytes(pitch=OTHER_PITCH))))


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (wav_bytes(1.0)[:30], "truncated or corrupt"),
        (b"plain text, not a clip at all", "not audio"),
    ],
)
def test_bad_audio_is_refused_and_the_runtime_still_answers(hearing: Runtime, data: bytes, said: str) -> None:
    with pytest.raises(InvalidRequestError, match=said) as refused:
        hearing.generate(messages=chat(audio_part(data)), max_tokens=4)
    assert refused.value.hint and "WAV" in refused.value.hint
    assert len(answer(hearing, chat(audio_part(wav_bytes())))) == N


def test_malformed_base64_is_refused_naming_the_part_shape(hearing: Runtime) -> None:
    part = {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}
    with pytest.raises(InvalidRequestError, match="base64 is malformed") as refused:
        hearing.generate(messages=chat(part), max_tokens=4)
    assert "input_audio" in str(refused.value.hint)


def test_audio_sent_in_an_image_part_is_refused_naming_input_audio(hearing: Runtime) -> None:
    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(1.0)).decode()
    with pytest.raises(InvalidRequestError, match="holds audio, not an image") as refused:
        hearing.generate(messages=chat({"type": "image_url", "image_url": {"url": url}}), max_tokens=4)
    assert "input_audio" in str(refused.value.hint)


def test_audio_sent_to_a_vision_only_projector_is_refused_naming_what_to_load(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    seeing = fresh(pair, "none", write_vision_projector_beside(tmp_path, TARGET))
    with seeing, pytest.raises(InvalidRequestError, match="reads images only") as refused:
        seeing.generate(messages=chat(audio_part(wav_bytes(1.0))), max_tokens=4)
    assert "audio encoder" in str(refused.value.hint)


def test_audio_sent_to_a_model_loaded_without_a_projector_names_mmproj(pair: tuple[Path, Path]) -> None:
    text_only = load(str(pair[0]), strategy="none", calibrate=False, n_ctx=N_CTX, threads=1)
    with text_only, pytest.raises(InvalidRequestError, match=r"reads text only.*holds audio") as refused:
        text_only.generate(messages=chat(audio_part(wav_bytes(1.0))), max_tokens=4)
    assert "--mmproj" in str(refused.value.hint)


# -- serve ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(pair: tuple[Path, Path]) -> Iterator[LocalServer]:
    with serving_runtimes(lambda: fresh(pair, "ngram"), "tiny-audio") as srv:
        yield srv


def test_serve_takes_input_audio_from_the_openai_client(pair: tuple[Path, Path], server: LocalServer) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    messages = chat(audio_part(wav_bytes(pitch=OTHER_PITCH)))
    reply = client.chat.completions.create(
        model="tiny-audio",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=N,
        temperature=0,
    )
    with fresh(pair, "none") as plain:
        expected = plain.generate(messages=messages, max_tokens=N, temperature=0).text
    assert reply.choices[0].message.content == expected


def test_serve_refuses_bad_audio_with_400(server: LocalServer) -> None:
    body = {"model": "tiny-audio", "messages": chat(audio_part(b"plain text, not a clip at all"))}
    reply = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400
    assert "not audio" in reply.json()["error"]["message"]


# -- the command line -------------------------------------------------------------------------------


def test_run_with_a_clip_answers_as_plain_decoding_does(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.cli.main import main

    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(pitch=PITCH))
    args = ["run", "What is said?", "-m", str(pair[0]), "--mmproj", str(pair[1]), "--audio", str(clip)]
    answers = []
    for strategy in ("none", "ngram"):
        code = main([*args, "-s", strategy, "-t", "0", "-n", str(N), "--json", "--ctx", str(N_CTX), "--threads", "1"])
        out, err = capsys.readouterr()
        assert code == 0, err
        answers.append(json.loads(out)["text"])
    assert answers[0] == answers[1] and answers[0]


def test_run_with_a_file_that_is_no_clip_is_refused_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.cli.main import main

    notes = tmp_path / "notes.wav"
    notes.write_text("not a recording at all")
    assert main(["run", "What is said?", "-m", "nowhere.gguf", "--audio", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "is not audio localspec reads" in err and "--audio" in err and "Traceback" not in err
    assert main(["run", "What is said?", "-m", "nowhere.gguf", "--audio", str(tmp_path / "gone.wav")]) == 2
    assert "cannot read the clip" in capsys.readouterr().err
