"""The scrolling conversation view. It follows new text only while the user is at the bottom:
Textual's anchor keeps it there until the user scrolls up, and picks up again once they
scroll back down."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Static

from localspec.tui.history import StoredMessage
from localspec.tui.images import label_of, stored_paths
from localspec.tui.widgets import STOPPED_NOTE, AssistantMessage, ErrorMessage, UserMessage

WELCOME = """\
[b]localspec chat[/b] — speculative decoding you can watch.

Type a message and press [b]Enter[/b] to send ([b]Shift+Enter[/b] or [b]Ctrl+J[/b] for a new line).
[b]Esc[/b] stops a reply, keeping what it wrote. [b]Ctrl+T[/b] highlights the text the drafter \
guessed and the target accepted. [b]PageUp[/b]/[b]PageDown[/b] scroll the chat, [b]Ctrl+O[/b] opens the \
settings, [b]Ctrl+P[/b] lists every command, [b]Ctrl+Q[/b] quits.\
"""


class Transcript(VerticalScroll):
    DEFAULT_CSS = """
    Transcript { padding: 0 1 1 1; }
    Transcript > #welcome { margin: 1 0 0 0; color: $text-muted; }
    """

    def on_mount(self) -> None:
        self.anchor()

    async def reset(self, messages: tuple[StoredMessage, ...] = ()) -> None:
        """Show a conversation from scratch (the welcome text when it is empty)."""
        await self.remove_children()
        if not messages:
            await self.mount(Static(WELCOME, id="welcome"))
        for message in messages:
            if message.role == "user":
                labels = [label_of(path) for path in stored_paths(message.stats)]
                await self.mount(UserMessage(message.content, labels))
            elif message.role == "assistant":
                note = STOPPED_NOTE if message.is_stopped else ""
                await self.mount(AssistantMessage(message.content, message.drafted_spans, note))
        self.anchor()

    async def add(self, widget: UserMessage | AssistantMessage | ErrorMessage | Static) -> None:
        for welcome in self.query("#welcome"):
            await welcome.remove()
        await self.mount(widget)

    def follow(self) -> None:
        """Jump to the bottom and follow: the user just sent something."""
        self.anchor()

    @property
    def showing_drafts(self) -> bool:
        return self.has_class("-show-drafts")

    def toggle_drafts(self) -> bool:
        self.toggle_class("-show-drafts")
        for message in self.query(AssistantMessage):
            message.refresh_drafts()
        return self.showing_drafts

    def last_reply(self) -> AssistantMessage | None:
        replies = self.query(AssistantMessage)
        return replies.last() if replies else None
