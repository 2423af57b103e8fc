"""The chat keeps what the user typed (issue 33): a prompt sent and abandoned before the first
token (quitting during prefill) is saved marked unanswered, and reopening the chat puts it
back in the input. Driven headless with Pilot, as tests/tui/test_tui_app.py does."""

from __future__ import annotations

import pytest

from localspec.core.sampling import SamplingConfig
from localspec.testing.tui_support import REFERENCE, answered, ready, reference_runtime, send, slow_runtime, wait_for
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.history import History, StoredMessage
from localspec.tui.screens import ConversationsScreen
from localspec.tui.widgets import UserMessage

SIZE = (100, 32)
PREFILL_SECONDS = 0.5  # each pass of the slowed model: the prompt is still being read when the app quits


@pytest.mark.asyncio
async def test_a_prompt_abandoned_during_prefill_is_saved_marked_unanswered() -> None:
    app = ChatApp(slow_runtime(delay=PREFILL_SECONDS), ChatSettings(sampling=SamplingConfig(temperature=0.0)))
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await send(app, pilot, "A question I typed")
        await wait_for(lambda: app.turn is not None, what="the prompt to be sent")
        assert app.turn is not None and app.turn.reply.text == ""
    history = History()
    [summary] = history.conversations()
    assert summary.title == "A question I typed"
    assert history.get(summary.id).messages == (StoredMessage.unanswered("A question I typed"),)


@pytest.mark.asyncio
async def test_reopening_a_chat_puts_its_unanswered_prompt_back_in_the_input() -> None:
    history = History()
    cid = history.create("earlier", "reference")
    history.append(cid, StoredMessage("user", "first"))
    history.append(cid, StoredMessage("assistant", "an answer"))
    history.append(cid, StoredMessage.unanswered("never answered"))
    history.close()
    app = ChatApp(reference_runtime, REFERENCE.with_changes(max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await pilot.press("ctrl+l")
        await wait_for(lambda: isinstance(app.screen, ConversationsScreen), what="the saved chats")
        await pilot.press("enter")
        await wait_for(lambda: app.conversation_id == cid, what="the conversation to reopen")
        assert app.prompt.text == "never answered"
        assert [m["content"] for m in app.messages] == ["first", "an answer"]
        assert [w.text for w in app.transcript.query(UserMessage)] == ["first"]
        await pilot.press("enter")  # sent as it was typed
        await answered(app, count=2)
    roles = [(m.role, m.content, m.is_unanswered) for m in History().get(cid).messages]
    assert roles[:3] == [("user", "first", False), ("assistant", "an answer", False), ("user", "never answered", False)]
    assert [r[0] for r in roles] == ["user", "assistant", "user", "assistant"]
