"""The chat picks up where the user left it: the last chat reopens, and the settings applied
last (model, strategy, draft length, temperature) are the next start's, unless the command
line says otherwise. Driven headless with Pilot, as tests/tui/test_tui_app.py does."""

from __future__ import annotations

import pytest

from localspec.cli.chat import with_remembered
from localspec.cli.main import build_parser
from localspec.cli.options import load_options
from localspec.testing.tui_support import REFERENCE, ready, reference_runtime, wait_for
from localspec.tui import ChatApp
from localspec.tui.history import History, StoredMessage
from localspec.tui.settings import remembered
from localspec.tui.widgets import UserMessage

SIZE = (100, 32)


@pytest.mark.asyncio
async def test_the_last_chat_reopens_at_start() -> None:
    history = History()
    older = history.create("older", "reference")
    history.append(older, StoredMessage("user", "old question"))
    newest = history.create("newest", "reference")
    history.append(newest, StoredMessage("user", "where was I?"))
    history.append(newest, StoredMessage("assistant", "here"))
    history.close()
    app = ChatApp(reference_runtime, REFERENCE, reopen_last=True)
    async with app.run_test(size=SIZE):
        await ready(app)
        await wait_for(lambda: app.conversation_id == newest, what="the last chat to reopen")
        assert [w.text for w in app.transcript.query(UserMessage)] == ["where was I?"]
        assert app.messages[-1] == {"role": "assistant", "content": "here"}


@pytest.mark.asyncio
async def test_settings_applied_are_kept_for_the_next_start_unless_given_again() -> None:
    app = ChatApp(reference_runtime, REFERENCE, remember_settings=True)
    async with app.run_test(size=SIZE):
        await ready(app)
        await app.apply_settings(app.settings.with_changes(strategy="ngram", draft_tokens=3, temperature=0.4))
        await wait_for(lambda: not app.loading and app.settings.load.strategy == "ngram", what="the new settings")
    saved = remembered()
    assert saved["strategy"] == "ngram" and saved["draft_tokens"] == 3 and saved["temperature"] == 0.4
    plain = build_parser().parse_args(["chat"])
    load, temperature = with_remembered(plain, load_options(plain), saved)
    assert (load.strategy, load.draft_tokens, temperature) == ("ngram", 3, 0.4)
    given = build_parser().parse_args(["chat", "-s", "draft", "-t", "0"])
    load, temperature = with_remembered(given, load_options(given), saved)
    assert (load.strategy, load.draft_tokens, temperature) == ("draft", 3, 0.0)
