"""`localspec chat` with images: `/image PATH` attaches one to the next message, the transcript
shows it, the conversation keeps it; driven headless with Pilot on the tiny vision pair
(tests/images/test_images.py), loaded by the chat's own loader as `localspec chat --mmproj` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localspec.api import load
from localspec.testing.tui_support import REFERENCE, answered, paste, ready, reference_runtime, replies, wait_for
from localspec.testing.vision_writer import png_bytes, write_vision_pair
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.models import load_runtime
from localspec.tui.widgets import ErrorMessage, UserMessage

SIZE = (100, 32)
N = 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_vision_pair(tmp_path_factory.mktemp("vision"))


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(24, 20, seed=3))
    return path


def seeing(pair: tuple[Path, Path]) -> ChatSettings:
    return ChatSettings().with_changes(
        model=str(pair[0]),
        mmproj=str(pair[1]),
        strategy="ngram",
        draft_tokens=3,
        calibrate=False,
        n_ctx=256,
        threads=1,
        temperature=0.0,
        max_tokens=N,
    )


def vision_app(pair: tuple[Path, Path], **kw: Any) -> ChatApp:
    return ChatApp(load_runtime, seeing(pair), **kw)


def plain_answer(pair: tuple[Path, Path], messages: list[dict[str, Any]]) -> str:
    with load(str(pair[0]), mmproj=str(pair[1]), strategy="none", calibrate=False, n_ctx=256, threads=1) as plain:
        return plain.generate(messages=messages, max_tokens=N, temperature=0).text


def errors(app: ChatApp) -> list[str]:
    return [str(w.render()) for w in app.transcript.query(ErrorMessage)]


def shown(app: ChatApp) -> list[str]:
    return [str(w.render()) for w in app.transcript.query(UserMessage)]


@pytest.mark.asyncio
async def test_an_attached_image_is_shown_answered_and_kept_in_the_conversation(
    pair: tuple[Path, Path], photo: Path
) -> None:
    app = vision_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await paste(app, pilot, f"/image {photo}")
        assert [a.name for a in app.attached] == ["photo.png"]
        assert "Attached photo.png" in str(app.status.render())
        await paste(app, pilot, "What is in the picture?")
        await answered(app)
        assert shown(app) == ["[image: photo.png]\nWhat is in the picture?"]
        assert app.attached == []  # it went with that message, not the next
        await paste(app, pilot, "And its colours?")
        await answered(app, count=2)
        sent = app._last_job.messages  # type: ignore[union-attr]
    image = {"type": "image", "path": str(photo)}
    first: list[dict[str, Any]] = [
        {"role": "user", "content": [image, {"type": "text", "text": "What is in the picture?"}]}
    ]
    assert sent[0]["content"][0]["type"] == "image"  # the second turn still shows the model the image
    assert replies(app)[0] == plain_answer(pair, first)
    follow_up = [
        *first,
        {"role": "assistant", "content": replies(app)[0]},
        {"role": "user", "content": "And its colours?"},
    ]
    assert replies(app)[1] == plain_answer(pair, follow_up)


@pytest.mark.asyncio
async def test_a_reopened_chat_shows_its_image_and_sends_it_again(pair: tuple[Path, Path], photo: Path) -> None:
    app = vision_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await paste(app, pilot, f"/image {photo}")
        await paste(app, pilot, "Describe it")
        await answered(app)
    again = vision_app(pair, reopen_last=True)
    async with again.run_test(size=SIZE):
        await ready(again)
        await wait_for(lambda: again.conversation_id is not None, what="the last chat to reopen")
        assert shown(again) == ["[image: photo.png]\nDescribe it"]
        assert again.messages[0]["content"][0] == {"type": "image", "data": photo.read_bytes(), "path": str(photo)}


@pytest.mark.asyncio
async def test_a_bad_path_is_said_in_the_chat_and_the_chat_goes_on(pair: tuple[Path, Path], tmp_path: Path) -> None:
    app = vision_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        missing = tmp_path / "nowhere.png"
        await paste(app, pilot, f"/image {missing}")
        [error] = errors(app)
        assert f"cannot read the image {missing}" in error and "check its path" in error
        assert app.attached == [] and app.prompt.text == f"/image {missing}"  # back, to correct
        app.prompt.clear()
        await paste(app, pilot, "Hello")
        await answered(app)
        assert len(replies(app)) == 1


@pytest.mark.asyncio
async def test_a_corrupt_image_is_refused_with_the_message_kept_and_a_bare_image_command_drops_it(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    corrupt = tmp_path / "cut.png"
    corrupt.write_bytes(png_bytes(24, 20)[:60])
    app = vision_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await paste(app, pilot, f"/image {corrupt}")
        await paste(app, pilot, "What is it?")
        await wait_for(lambda: errors(app), what="the refusal")
        assert "truncated or corrupt" in errors(app)[0]
        assert app.prompt.text == "What is it?" and [a.name for a in app.attached] == ["cut.png"]
        assert app.messages == [] and shown(app) == []
        app.prompt.clear()
        await paste(app, pilot, "/image")
        assert app.attached == []
        await paste(app, pilot, "What is it?")
        await answered(app)


@pytest.mark.asyncio
async def test_an_image_for_a_model_that_reads_text_only_names_the_projector(photo: Path) -> None:
    app = ChatApp(reference_runtime, REFERENCE)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await paste(app, pilot, f"/image {photo}")
        [error] = errors(app)
        assert "reads text only" in error and "--mmproj" in error
        assert app.attached == []
