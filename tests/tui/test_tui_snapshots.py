"""Snapshots of the chat's main screens (pytest-textual-snapshot). Deterministic: the reference
backend, stored conversations with stored figures, a fixed terminal size and time zone.
Refresh after an intended change with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from localspec.core.errors import ModelLoadError
from localspec.testing.tui_support import REFERENCE, ready, reference_runtime, wait_for
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.history import History, StoredMessage, history_file
from localspec.tui.screens import ConversationsScreen, LoadErrorScreen, SettingsScreen

SIZE = (100, 32)
SAVED_AT = 1_767_225_600.0  # 2026-01-01 00:00 UTC

REPLY = """\
Use a list comprehension:

```python
squares = [n * n for n in numbers if n % 2 == 0]
```

It reads as **one** expression and avoids `append` in a loop."""

FIGURES = {
    "tokens": 41,
    "tokens_per_s": 212.4,
    "acceptance": 0.81,
    "tokens_per_step": 3.42,
    "gamma": 4.1,
    "est_speedup": 1.87,
    "strategy": "ngram",
    "final": True,
    "finish_reason": "stop",
}


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def saved_conversation() -> int:
    history = History()
    cid = history.create("Rewrite with a list comprehension", "reference-v259-s0")
    history.append(cid, StoredMessage("user", "Rewrite this loop with a list comprehension."))
    history.append(cid, StoredMessage("assistant", REPLY, {"figures": FIGURES}, ((0, 26), (40, 90), (120, 150))))
    history.close()
    with sqlite3.connect(history_file()) as db:
        db.execute("UPDATE conversations SET updated = ?", (SAVED_AT,))
    return cid


def app() -> ChatApp:
    return ChatApp(reference_runtime, REFERENCE)


def still(run_before: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    """The prompt's cursor blinks every 0.5 s, so a screenshot would show it or not by how long
    the steps before it took: with blinking off, a focused prompt always shows its cursor."""

    async def run(pilot: Any) -> None:
        pilot.app.prompt.cursor_blink = False
        await run_before(pilot)

    return run


async def opened(pilot: Any) -> None:
    cid = saved_conversation()
    await ready(pilot.app)
    await pilot.app.open_conversation(cid)
    await pilot.pause()


def test_ready_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await ready(pilot.app)

    assert snap_compare(app(), terminal_size=SIZE, run_before=still(run_before))


def test_reopened_conversation_renders_markdown_and_its_figures(snap_compare: Any) -> None:
    assert snap_compare(app(), terminal_size=SIZE, run_before=still(opened))


def test_drafted_text_highlighted(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await opened(pilot)
        pilot.app.transcript.toggle_drafts()
        await pilot.pause()

    assert snap_compare(app(), terminal_size=SIZE, run_before=still(run_before))


def test_settings_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await ready(pilot.app)
        await pilot.press("ctrl+o")
        await wait_for(lambda: isinstance(pilot.app.screen, SettingsScreen), what="the settings")
        await pilot.pause()

    assert snap_compare(app(), terminal_size=SIZE, run_before=still(run_before))


def test_saved_chats_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        saved_conversation()
        await ready(pilot.app)
        await pilot.press("ctrl+l")
        await wait_for(lambda: isinstance(pilot.app.screen, ConversationsScreen), what="the saved chats")
        await pilot.pause()

    assert snap_compare(app(), terminal_size=SIZE, run_before=still(run_before))


def test_load_error_screen(snap_compare: Any) -> None:
    def broken(settings: ChatSettings, on_progress: Any) -> Any:
        raise ModelLoadError("model.gguf is truncated: 1.2 MB of 98 MB", "pull it again: localspec pull smollm2")

    async def run_before(pilot: Any) -> None:
        await wait_for(lambda: isinstance(pilot.app.screen, LoadErrorScreen), what="the error screen")
        await pilot.pause()

    failing = ChatApp(broken, ChatSettings().with_changes(model="model.gguf"))
    assert snap_compare(failing, terminal_size=SIZE, run_before=still(run_before))
