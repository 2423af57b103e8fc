"""The chat app, driven headless with Pilot on the reference backend: what a user does, and
what they must see."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from textual.command import CommandList
from textual.widgets import Static

from localspec.api import Runtime, runtime_for
from localspec.common.progress import Announce
from localspec.core.errors import ModelLoadError
from localspec.core.sampling import SamplingConfig
from localspec.testing.tui_support import (
    REFERENCE,
    answered,
    paste,
    ready,
    reference_runtime,
    replies,
    send,
    slow_runtime,
    wait_for,
)
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.history import History, StoredMessage
from localspec.tui.models import MissingModel
from localspec.tui.screens import ConversationsScreen, FetchScreen, LoadErrorScreen, SettingsScreen
from localspec.tui.widgets import AssistantMessage, ErrorMessage, StatusLine, UserMessage

SIZE = (100, 32)


def highlighted_command(app: ChatApp) -> str:
    lists = app.screen.query(CommandList)
    if not lists or lists.first().highlighted is None:
        return ""
    command_list = lists.first()
    return str(command_list.get_option_at_index(command_list.highlighted).prompt)  # type: ignore[arg-type]


def reference_app(**changes: object) -> ChatApp:
    return ChatApp(reference_runtime, REFERENCE.with_changes(**changes))


@pytest.mark.asyncio
async def test_a_typed_prompt_gets_a_streamed_reply_with_stats() -> None:
    app = reference_app(max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "Hello there")
        await answered(app)
        assert app.messages[0] == {"role": "user", "content": "Hello there"}
        assert replies(app)[0] == app.transcript.last_reply().text  # type: ignore[union-attr]
        status = str(app.status.render())
        assert "tok/s" in status and "tok/step" in status and "est." in status


@pytest.mark.asyncio
async def test_the_reply_equals_what_the_api_generates() -> None:
    app = reference_app(max_tokens=60)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "Same answer")
        await answered(app)
    with reference_runtime(REFERENCE) as rt:
        expected = rt.generate(messages=[{"role": "user", "content": "Same answer"}], max_tokens=60, temperature=0)
    assert replies(app) == [expected.text]


@pytest.mark.asyncio
async def test_shift_enter_and_ctrl_j_make_a_multi_line_prompt() -> None:
    app = reference_app(max_tokens=5)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        app.prompt.focus()
        await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")
        assert app.prompt.text == "a\nb\nc"
        await pilot.press("enter")
        await answered(app)
        assert app.messages[0]["content"] == "a\nb\nc"


def writing_app() -> ChatApp:
    return ChatApp(slow_runtime(delay=0.01), ChatSettings(sampling=SamplingConfig(temperature=0.0), max_tokens=2000))


async def writing(app: ChatApp, pilot: Any) -> None:
    """The app ready, a long reply asked for and a few characters of it written."""
    await ready(app)
    await send(app, pilot, "Write a lot")
    await wait_for(lambda: app.turn is not None and len(app.turn.reply.text) > 5, what="text to stream")


@pytest.mark.asyncio
async def test_esc_stops_at_once_keeps_the_partial_reply_marked_stopped_and_the_model_stays_usable() -> None:
    app = writing_app()
    async with app.run_test(size=SIZE) as pilot:
        await writing(app, pilot)
        job = app.turn.job  # type: ignore[union-attr]
        await pilot.press("escape")
        assert app.turn is None
        assert app.prompt.text == ""
        [reply] = app.transcript.query(AssistantMessage)
        assert len(reply.text) > 5 and "Stopped" in str(reply.query_one(".note", Static).render())
        assert app.messages == [
            {"role": "user", "content": "Write a lot"},
            {"role": "assistant", "content": reply.text},
        ]
        assert "Stopped" in str(app.status.render())
        await wait_for(job.released.is_set, what="the runtime to be released")
        app.runtime.target.delay = 0.0  # type: ignore[union-attr]
        app.settings = app.settings.with_changes(max_tokens=20)
        await send(app, pilot, "Again")
        await answered(app, count=2)
        assert [m["role"] for m in app.messages] == ["user", "assistant", "user", "assistant"]
    [summary] = History().conversations()
    saved = History().get(summary.id).messages
    assert saved[1].content == reply.text and saved[1].is_stopped
    assert not saved[3].is_stopped


@pytest.mark.asyncio
async def test_esc_before_the_first_word_puts_the_prompt_back() -> None:
    app = ChatApp(slow_runtime(delay=3.0), ChatSettings(sampling=SamplingConfig(temperature=0.0)))  # still reading
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "Never mind")
        await wait_for(lambda: app.turn is not None, what="the prompt to be sent")
        await pilot.press("escape")
        assert app.turn is None and app.prompt.text == "Never mind"
        assert not app.transcript.query(UserMessage) and app.messages == []


@pytest.mark.asyncio
async def test_a_reply_saved_by_quitting_is_marked_stopped_and_reopens_with_the_mark() -> None:
    app = writing_app()
    async with app.run_test(size=SIZE) as pilot:
        await writing(app, pilot)
        await pilot.press("ctrl+q")
    [summary] = History().conversations()
    [_, kept] = History().get(summary.id).messages
    assert kept.is_stopped and len(kept.content) > 5
    reopened = reference_app(max_tokens=5)
    async with reopened.run_test(size=SIZE) as pilot:
        await ready(reopened)
        await reopened.open_conversation(summary.id)
        [reply] = reopened.transcript.query(AssistantMessage)
        assert "Stopped" in str(reply.query_one(".note", Static).render())


@pytest.mark.asyncio
async def test_scrolling_up_while_a_reply_streams_is_not_hijacked() -> None:
    app = ChatApp(slow_runtime(delay=0.004), ChatSettings(sampling=SamplingConfig(temperature=0.0), max_tokens=20000))
    async with app.run_test(size=(60, 16)) as pilot:
        await ready(app)
        await send(app, pilot, "Long answer please")
        transcript = app.transcript
        await wait_for(lambda: transcript.max_scroll_y > 5, what="the reply to overflow the view")
        assert transcript.scroll_y == transcript.max_scroll_y  # following the new text
        transcript.scroll_home(animate=False)
        await pilot.pause()
        await wait_for(lambda: transcript.max_scroll_y > 15, what="more text below")
        assert transcript.scroll_y == 0
        await pilot.press("escape")


@pytest.mark.asyncio
async def test_switching_strategy_from_the_command_palette_reloads_and_keeps_chatting() -> None:
    app = reference_app(max_tokens=20)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        first = app.runtime
        await pilot.press("ctrl+p")
        await pilot.press(*"Strategy: ngram")
        await wait_for(lambda: highlighted_command(app).startswith("Strategy: ngram"), what="the command")
        await pilot.press("enter")
        await wait_for(
            lambda: app.runtime is not first and app.runtime is not None and not app.loading, what="the new runtime"
        )
        assert app.runtime.strategy == "ngram"  # type: ignore[union-attr]
        assert app.settings.load.strategy == "ngram"
        await send(app, pilot, "After the switch")
        await answered(app)
        assert "ngram" in str(app.status.render())


@pytest.mark.asyncio
async def test_settings_screen_changes_temperature_and_draft_length() -> None:
    app = reference_app(max_tokens=10)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await pilot.press("ctrl+o")
        await wait_for(lambda: isinstance(app.screen, SettingsScreen), what="the settings screen")
        app.screen.query_one("#temperature").value = "0.5"  # type: ignore[attr-defined]
        app.screen.query_one("#draft-tokens").value = "3"  # type: ignore[attr-defined]
        await pilot.pause()
        await pilot.click("#apply")
        await wait_for(lambda: app.settings.load.draft_tokens == 3 and not app.loading, what="the new settings")
        assert app.settings.sampling.temperature == 0.5
        assert app.runtime is not None and app.runtime.policy.gamma == 3  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_settings_screen_refuses_a_bad_value_and_says_why() -> None:
    app = reference_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await pilot.press("ctrl+o")
        await wait_for(lambda: isinstance(app.screen, SettingsScreen), what="the settings screen")
        app.screen.query_one("#draft-tokens").value = "lots"  # type: ignore[attr-defined]
        await pilot.pause()
        await pilot.click("#apply")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert "draft length must be" in str(app.screen.query_one("#settings-error").render())


@pytest.mark.asyncio
async def test_a_conversation_is_saved_and_reopens_after_a_restart(tmp_path: Path) -> None:
    app = reference_app(max_tokens=15)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "Remember me")
        await answered(app)
        saved = list(app.messages)
    reopened = reference_app(max_tokens=15)
    async with reopened.run_test(size=SIZE) as pilot:
        await ready(reopened)
        await pilot.press("ctrl+l")
        await wait_for(lambda: isinstance(reopened.screen, ConversationsScreen), what="the saved chats")
        await pilot.press("enter")
        await wait_for(lambda: reopened.messages == saved, what="the conversation to reopen")
        assert [w.text for w in reopened.transcript.query(UserMessage)] == ["Remember me"]
        assert "Last reply" in str(reopened.status.render())
        await send(reopened, pilot, "And again")
        await answered(reopened, count=2)
    history = History()
    [summary] = history.conversations()
    assert summary.title == "Remember me" and summary.n_messages == 4


@pytest.mark.asyncio
async def test_new_chat_regenerate_and_copy() -> None:
    app = reference_app(max_tokens=15, temperature=0.9, seed=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "First")
        await answered(app)
        await pilot.press("ctrl+g")
        assert app.clipboard == replies(app)[0]
        await pilot.press("ctrl+r")
        await answered(app)
        assert [m["role"] for m in app.messages] == ["user", "assistant"]
        assert len(app.transcript.query(AssistantMessage)) == 1
        await pilot.press("ctrl+n")
        assert app.messages == [] and app.conversation_id is None
        assert not app.transcript.query(AssistantMessage)
    [saved] = History().conversations()
    assert saved.n_messages == 2  # the regenerated reply replaced the first one


@pytest.mark.asyncio
async def test_drafted_text_can_be_highlighted() -> None:
    app = reference_app(max_tokens=80, strategy="draft", draft_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "Show drafts")
        await answered(app)
        reply = app.transcript.last_reply()
        assert reply is not None and reply.spans  # the noisy drafter gets some tokens accepted
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.transcript.showing_drafts
        drafts = reply.query_one(".drafts")
        assert drafts.display and not reply.query_one("Markdown").display
        assert "drafted and accepted" in str(drafts.render())


@pytest.mark.asyncio
async def test_a_slow_load_step_says_what_it_is_doing_on_the_status_line() -> None:
    release = threading.Event()

    def deriving(settings: ChatSettings, on_progress: Announce) -> Runtime:
        on_progress("deriving a q4_0 drafter from model.gguf")  # what load() says after 2 s
        release.wait(timeout=30)
        return reference_runtime(settings)

    app = ChatApp(deriving, REFERENCE)
    async with app.run_test(size=SIZE):
        status = app.query_one(StatusLine)
        await wait_for(lambda: "Deriving a q4_0 drafter from model.gguf…" in str(status.render()), what="the step")
        release.set()
        await wait_for(lambda: app.runtime is not None, what="the runtime")


@pytest.mark.asyncio
async def test_a_model_that_fails_to_load_is_explained_in_the_app() -> None:
    def broken(settings: ChatSettings, on_progress: object) -> object:
        raise ModelLoadError("model.gguf is not a GGUF file", "pass the path of a .gguf model")

    app = ChatApp(broken, ChatSettings().with_changes(model="model.gguf"))  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: isinstance(app.screen, LoadErrorScreen), what="the error screen")
        text = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "not a GGUF file" in text and "pass the path of a .gguf model" in text
        await pilot.pause()
        await pilot.click("#settings")
        await wait_for(lambda: isinstance(app.screen, SettingsScreen), what="the settings screen")


@pytest.mark.asyncio
async def test_a_full_context_is_reported_with_what_to_do() -> None:
    app = reference_app(n_ctx=64)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await paste(app, pilot, "x" * 80)
        await wait_for(lambda: app.transcript.query(ErrorMessage), what="the error")
        error = str(app.transcript.query(ErrorMessage).last().render())
        assert "context holds 64" in error and "Ctrl+N starts a new chat" in error
        assert app.prompt.text == "x" * 80 and app.turn is None


@pytest.mark.asyncio
async def test_a_corrupt_history_is_reported_and_set_aside(temporary_localspec_home: Path) -> None:
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    (temporary_localspec_home / "history.sqlite3").write_bytes(b"this is not a database" * 100)
    app = reference_app(max_tokens=5)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        notice = str(app.transcript.query(ErrorMessage).first().render())
        assert "moved to history.sqlite3.corrupt-" in notice
        await send(app, pilot, "Still saves")
        await answered(app)
    assert len(list(temporary_localspec_home.glob("history.sqlite3.corrupt-*"))) == 1
    assert History().conversations()[0].title == "Still saves"


@pytest.mark.asyncio
async def test_a_missing_model_is_offered_for_download_with_progress(tmp_path: Path) -> None:
    marker = tmp_path / "fetched"

    def fetch(progress: object) -> None:
        for done in range(0, 101, 25):
            progress(done, 100, f"{done} of 100 MB")  # type: ignore[operator]
        marker.write_text("ok")

    def missing(settings: ChatSettings) -> MissingModel | None:
        return None if marker.exists() else MissingModel("The pair is not pulled yet.", fetch)

    app = ChatApp(reference_runtime, REFERENCE, missing_model=missing)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: isinstance(app.screen, FetchScreen), what="the download offer")
        assert app.runtime is None
        await pilot.pause()
        await pilot.click("#download")
        await ready(app)
        assert marker.exists()


@pytest.mark.asyncio
async def test_a_stored_message_with_damaged_stats_still_opens() -> None:
    history = History()
    cid = history.create("Old chat", "reference", "")
    history.append(cid, StoredMessage("user", "hi"))
    history.append(cid, StoredMessage("assistant", "**hello**", {"figures": {"unknown": 1}}))
    history.close()
    app = reference_app()
    async with app.run_test(size=SIZE):
        await ready(app)
        await app.open_conversation(cid)
        assert app.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "**hello**"}]


@pytest.mark.asyncio
async def test_saved_chats_are_remembered_for_lookup_once_the_model_is_ready() -> None:
    from localspec.core.backend_loader import load_backend
    from localspec.drafters.memory import NgramMemory

    saved = [StoredMessage("user", "Name a river"), StoredMessage("assistant", "The Nile runs through Egypt.")]
    history = History()
    cid = history.create("Rivers", "reference", "be brief")
    for message in saved:
        history.append(cid, message)
    history.close()

    def remembering(settings: ChatSettings, on_progress: Announce | None = None) -> Runtime:
        target = load_backend("reference", "reference", n_ctx=settings.load.n_ctx)
        return runtime_for(target, None, strategy="ngram", memory=NgramMemory())

    app = ChatApp(remembering, REFERENCE.with_changes(strategy="ngram", draft_model=None))
    async with app.run_test(size=SIZE):
        await ready(app)
        runtime = app.runtime
        assert runtime is not None and runtime.memory is not None
        await wait_for(lambda: len(runtime.memory) > 0, what="the saved chat in the memory")  # type: ignore[arg-type]
        chat = [{"role": "system", "content": "be brief"}, *({"role": m.role, "content": m.content} for m in saved)]
        assert len(runtime.memory) == len(runtime.prompt_tokens(messages=chat))
