"""The chat's keys can be found and work where the user is: PageUp scrolls from the prompt,
the settings open on a field, typing goes on in the prompt after a dialog, the footer says
how to quit. Driven headless with Pilot, as tests/tui/test_tui_app.py does."""

from __future__ import annotations

import pytest
from textual.widgets import Footer, Input

from localspec.core.sampling import SamplingConfig
from localspec.testing.tui_support import REFERENCE, ready, reference_runtime, slow_runtime, wait_for
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.screens import SettingsScreen

SIZE = (100, 32)


@pytest.mark.asyncio
async def test_page_up_scrolls_the_chat_while_typing_in_the_prompt() -> None:
    app = ChatApp(slow_runtime(delay=0.0), ChatSettings(sampling=SamplingConfig(temperature=0.0), max_tokens=600))
    async with app.run_test(size=(60, 16)) as pilot:
        await ready(app)
        await app.start_turn("Long answer please")
        await wait_for(lambda: app.turn is None, what="the reply to end")
        transcript = app.transcript
        await wait_for(lambda: transcript.max_scroll_y > 10, what="a chat taller than the view")
        transcript.scroll_end(animate=False)
        await pilot.pause()
        bottom = transcript.scroll_y
        assert app.focused is app.prompt
        await pilot.press("pageup")
        await wait_for(lambda: transcript.scroll_y < bottom, what="the chat to scroll up")
        assert app.focused is app.prompt
        await pilot.press("pagedown")
        await wait_for(lambda: transcript.scroll_y == bottom, what="the chat to scroll back down")


@pytest.mark.asyncio
async def test_settings_open_on_a_field_and_typing_returns_to_the_prompt_after_apply() -> None:
    app = ChatApp(reference_runtime, REFERENCE.with_changes(max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await pilot.press("ctrl+o")
        await wait_for(lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        assert isinstance(app.focused, Input) and app.focused.id == "model"
        await pilot.press("tab", "tab", "tab")  # model, draft model, strategy, then draft length
        assert isinstance(app.focused, Input) and app.focused.id == "draft-tokens"
        await pilot.press(*"\b\b\b\b3", "enter")  # Enter in a field applies
        await wait_for(lambda: not isinstance(app.screen, SettingsScreen), what="the dialog to close")
        await wait_for(lambda: app.settings.load.draft_tokens == 3 and not app.loading, what="the new settings")
        await pilot.press(*"hello")
        assert app.prompt.text == "hello"


@pytest.mark.asyncio
async def test_the_footer_says_how_to_quit() -> None:
    app = ChatApp(reference_runtime, REFERENCE)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app)
        await pilot.pause()
        keys = [b.binding for b in app.screen.active_bindings.values() if b.binding.show]
        assert ("ctrl+q", "Quit") in [(b.key, b.description) for b in keys]
        assert app.screen.query_one(Footer).display
