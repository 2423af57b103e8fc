"""Saved chats in the chat app: each turn written to the history as it ends, a saved chat
reopened (its unanswered prompt back in the input), listed and deleted."""

from __future__ import annotations

from typing import Any

from localspec.tui.chat_base import ChatBase, HistoryWrite, Turn
from localspec.tui.history import History, HistoryError, StoredMessage
from localspec.tui.images import Attachment, reread, stored_paths, text_of, user_message
from localspec.tui.live_stats import Figures, format_figures
from localspec.tui.screens import ConversationsScreen


class SavedChats(ChatBase):
    """The part of the chat app that keeps its chats in the history."""

    async def reopen_last(self) -> None:
        """Where the user was: the newest saved chat, back on screen."""
        if self.history is None:
            return
        try:
            newest = self.history.conversations(1)
        except HistoryError:
            return  # the history's notice has said why
        if newest:
            await self.open_conversation(newest[0].id)
            self.notify(
                f"Reopened your last chat, “{newest[0].title}”: Ctrl+N starts a new one, Ctrl+L lists the others.",
                timeout=8,
            )

    def save_turn(self, turn: Turn, reply: StoredMessage) -> None:
        def write(history: History, cid: int) -> None:
            if self._reopened_unanswered:  # it was put back in the input; this turn replaces it
                history.drop_last(cid, "user")
                self._reopened_unanswered = False
            history.append(cid, StoredMessage("user", turn.prompt, image_stats(turn.images)))
            history.append(cid, reply)

        self._save(write)

    def _save(self, write: HistoryWrite) -> None:
        if self.history is None:
            return
        try:
            if self.conversation_id is None:
                title = next((text_of(m) for m in self.messages if m["role"] == "user"), "chat")
                model = self.settings.model_label()
                self.conversation_id = self.history.create(_title(title), model, self.settings.system)
            write(self.history, self.conversation_id)
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error", timeout=10)

    async def open_conversation(self, conversation_id: int) -> None:
        if self.history is None:
            return
        try:
            conversation = self.history.get(conversation_id)
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error")
            return
        await self.cancel_turn()
        messages = conversation.messages
        unanswered = messages[-1] if messages and messages[-1].is_unanswered else None
        missing: list[str] = []
        if unanswered is not None:  # not a turn: back in the input, to send or edit
            messages = messages[:-1]
            self.prompt.load_text(unanswered.content)
            self.prompt.move_cursor(self.prompt.document.end)
            self.attached, missing = reread(stored_paths(unanswered.stats))
        self._reopened_unanswered = unanswered is not None
        await self.transcript.reset(messages)
        self.messages = []
        for m in messages:
            images, gone = reread(stored_paths(m.stats))
            missing += gone
            self.messages.append(
                user_message(m.content, images) if m.role == "user" else {"role": m.role, "content": m.content}
            )
        if missing:
            self.notify(
                f"Images of this chat are no longer on disk, so the model will not see them: {', '.join(missing)}",
                title="Chat history",
                severity="warning",
                timeout=10,
            )
        self.conversation_id = conversation.id
        self.settings = self.settings.with_changes(system=conversation.system)
        self.update_topbar()
        figures = next(
            (Figures.from_dict(m.stats.get("figures", {})) for m in reversed(conversation.messages) if m.stats), None
        )
        self.last_figures = figures
        self.status.show(f"Last reply: {format_figures(figures)}" if figures else f"Opened “{conversation.title}”")

    def action_conversations(self) -> None:
        if self.history is None:
            return
        try:
            listed = self.history.conversations()
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error")
            return
        screen = ConversationsScreen(listed, self.history.notice)

        async def chosen(conversation_id: int | None) -> None:
            self.prompt.focus()
            self._delete_conversations(screen.deleted)
            if conversation_id is not None:
                await self.open_conversation(conversation_id)

        self.push_screen(screen, chosen)

    def _delete_conversations(self, ids: list[int]) -> None:
        if self.history is None:
            return
        for conversation_id in ids:
            try:
                self.history.delete(conversation_id)
            except HistoryError as exc:
                self.notify(str(exc), title="Chat history", severity="error")
            if conversation_id == self.conversation_id:
                self.conversation_id = None  # the view stays; going on starts a new saved chat


def image_stats(images: tuple[Attachment, ...]) -> dict[str, Any] | None:
    """What a saved user message keeps of its images: their paths (read again on reopening)."""
    return {"images": [a.path for a in images]} if images else None


def _title(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
