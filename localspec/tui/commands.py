"""The chat app's commands beyond writing a reply: copy, drafted-text highlighting, attach,
settings, and the command palette's entries for them and for quick setting changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from textual.app import SystemCommand
from textual.screen import Screen

from localspec.tui.chat_base import ChatBase
from localspec.tui.images import USAGE
from localspec.tui.screens import SettingsScreen, strategy_choices
from localspec.tui.settings import ChatSettings


class ChatCommands(ChatBase):
    """The part of the chat app that answers its commands and lists them in the palette."""

    def action_copy_reply(self) -> None:
        reply = next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), None)
        if reply is None:
            self.notify("There is no reply to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(reply)
        self.notify("Copied the last reply.")

    def action_toggle_drafts(self) -> None:
        shown = self.transcript.toggle_drafts()
        self.notify(
            "Highlighting the text the drafter guessed and the target accepted."
            if shown
            else "Showing replies as Markdown."
        )

    def action_attach(self) -> None:
        """Start the /image command in the input: the path is typed (or pasted) after it."""
        self.prompt.load_text("/image ")
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    def action_settings(self) -> None:
        self.open_settings(self.settings)

    def open_settings(self, settings: ChatSettings) -> None:
        async def chosen(new: ChatSettings | None) -> None:
            self.prompt.focus()  # typing goes on where it was, whatever the dialog ended with
            if new is not None:
                await self.apply_settings(new)

        self.push_screen(SettingsScreen(settings), chosen)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New chat", "Start a new conversation (Ctrl+N)", self.action_new_chat)
        yield SystemCommand("Regenerate", "Write the last reply again (Ctrl+R)", self.action_regenerate)
        yield SystemCommand("Copy last reply", "Copy the last reply to the clipboard (Ctrl+G)", self.action_copy_reply)
        yield SystemCommand(
            "Show drafted text", "Toggle highlighting of drafted, accepted text (Ctrl+T)", self.action_toggle_drafts
        )
        yield SystemCommand("Attach an image", USAGE, self.action_attach)
        yield SystemCommand("Settings", "Pair, strategy, draft length, temperature (Ctrl+O)", self.action_settings)
        yield SystemCommand("Saved chats", "Reopen or delete a saved conversation (Ctrl+L)", self.action_conversations)
        for name in strategy_choices(self.settings.load.strategy):
            if name != self.settings.load.strategy:
                yield SystemCommand(f"Strategy: {name}", f"Switch to strategy {name}", self._setter(strategy=name))
        for tokens in ("auto", 0, 2, 4, 8):
            if tokens != self.settings.load.draft_tokens:
                yield SystemCommand(
                    f"Draft length: {tokens}",
                    "auto adapts to this machine and the text",
                    self._setter(draft_tokens=tokens),
                )
        for temperature in (0.0, 0.7, 1.0):
            if temperature != self.settings.sampling.temperature:
                yield SystemCommand(
                    f"Temperature: {temperature:g}", "0 is greedy", self._setter(temperature=temperature)
                )

    def _setter(self, **changes: object) -> Callable[[], Awaitable[None]]:
        async def apply() -> None:
            await self.apply_settings(self.settings.with_changes(**changes))

        return apply
