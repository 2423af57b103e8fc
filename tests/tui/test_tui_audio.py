"""`localspec chat` with an audio clip: `/audio PATH` attaches it to the next message, the
transcript shows it, and the answer is plain decoding's on the same clip; driven headless with
Pilot on the tiny audio pair (tests/images/test_audio.py), loaded by the chat's own loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localspec.api import load
from localspec.testing.audio_writer import AudioSpec, wav_bytes, write_audio_pair
from localspec.testing.gguf_writer import Spec
from localspec.testing.tui_support import answered, paste, ready, replies
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.models import load_runtime
from localspec.tui.widgets import UserMessage

SIZE = (100, 32)
N = 8
N_CTX = 1024  # a clip takes 750 positions (one 30 s window)
TARGET = Spec(arch="llama", n_ctx=N_CTX)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_audio_pair(tmp_path_factory.mktemp("audio"), TARGET, AudioSpec(out_width=TARGET.hidden))


def hearing(pair: tuple[Path, Path]) -> ChatSettings:
    return ChatSettings().with_changes(
        model=str(pair[0]),
        mmproj=str(pair[1]),
        strategy="ngram",
        draft_tokens=3,
        calibrate=False,
        n_ctx=N_CTX,
        threads=1,
        temperature=0.0,
        max_tokens=N,
    )


@pytest.mark.asyncio
async def test_an_attached_clip_is_shown_and_answered_as_plain_decoding_answers_it(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(pitch=440.0))
    app = ChatApp(load_runtime, hearing(pair))
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await paste(app, pilot, f"/audio {clip}")
        assert [a.label for a in app.attached] == ["audio: clip.wav"]
        await paste(app, pilot, "What is said?")
        await answered(app)
        shown = [str(w.render()) for w in app.transcript.query(UserMessage)]
        sent = app._last_job.messages  # type: ignore[union-attr]
    assert shown == ["[audio: clip.wav]\nWhat is said?"]
    assert sent[0]["content"][0]["type"] == "input_audio"
    part = {"type": "input_audio", "input_audio": {"data": clip.read_bytes(), "format": "wav"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [part, {"type": "text", "text": "What is said?"}]}]
    with load(str(pair[0]), mmproj=str(pair[1]), strategy="none", calibrate=False, n_ctx=N_CTX, threads=1) as plain:
        assert replies(app)[0] == plain.generate(messages=messages, max_tokens=N, temperature=0).text
