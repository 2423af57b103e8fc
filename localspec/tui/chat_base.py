"""The chat app's state and widgets, declared once so that each part of the app (loading a
model, saved chats, commands) can live in a module of its own and still read them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.app import App
from textual.widgets import Static

from localspec.api import Runtime
from localspec.tui.attribution import DraftAttribution
from localspec.tui.history import History
from localspec.tui.images import Attachment
from localspec.tui.job import ReplyJob
from localspec.tui.live_stats import Figures
from localspec.tui.models import MissingCheck, RuntimeLoader
from localspec.tui.settings import ChatSettings
from localspec.tui.transcript import Transcript
from localspec.tui.widgets import AssistantMessage, PromptInput, StatusLine, UserMessage

HistoryWrite = Callable[[History, int], None]


@dataclass
class Turn:
    """The reply being written and what it answers."""

    job: ReplyJob
    prompt: str
    message: dict[str, Any]  # the user's message as sent, images included
    images: tuple[Attachment, ...]
    user: UserMessage
    reply: AssistantMessage
    attribution: DraftAttribution


class ChatBase(App[None]):
    """What every part of the chat app shares: its settings, runtime, history, chat and widgets."""

    def __init__(
        self,
        load_runtime: RuntimeLoader,
        settings: ChatSettings | None = None,
        *,
        missing_model: MissingCheck | None = None,
        history_path: Path | None = None,
        reopen_last: bool = False,
        remember_settings: bool = False,
    ) -> None:
        super().__init__()
        self._reopen_last = reopen_last  # open the newest saved chat at start (`localspec chat`)
        self._remember_settings = remember_settings  # keep the settings applied for the next start
        self.settings = settings or ChatSettings()
        self._load_runtime = load_runtime
        self._missing_model = missing_model
        self._history_path = history_path
        self.history: History | None = None
        self.runtime: Runtime | None = None
        self._plain_step: Callable[[], float | None] = lambda: None  # the runtime's modelled t_verify(1)
        self.loading = False
        self._turn: Turn | None = None
        self._last_job: ReplyJob | None = None  # the newest job on the current runtime
        self.messages: list[dict[str, Any]] = []
        self.attached: list[Attachment] = []  # images /image attached to the next message
        self.conversation_id: int | None = None
        self._reopened_unanswered = False  # the open chat's unanswered prompt is in the input
        self.last_figures: Figures | None = None

    @property
    def turn(self) -> Turn | None:
        return self._turn

    @turn.setter
    def turn(self, turn: Turn | None) -> None:
        self._turn = turn
        self.refresh_bindings()  # Esc (stop) shows in the footer only while a reply is written

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    def update_topbar(self) -> None:
        s = self.settings
        parts = [
            "localspec chat",
            s.model_label(),
            f"strategy {getattr(self.runtime, 'label', s.load.strategy) if self.runtime else s.load.strategy}",
            f"draft length {s.load.draft_tokens}",
            f"temperature {s.sampling.temperature:g}",
        ]
        if self.history is not None and not self.history.persistent:
            parts.append("history not saved")
        self.query_one("#topbar", Static).update(" · ".join(parts))

    def show_ready(self) -> None:
        if self.runtime is None:
            return
        hint = "Enter sends · Esc stops · PageUp scrolls · Ctrl+T drafted text · Ctrl+P commands · Ctrl+Q quits"
        self.status.show(f"Ready: {self.settings.model_label()} · {hint}")

    # -- what one part asks of another (each is defined by the part named) ---------------

    async def cancel_turn(self) -> None:
        """Take back the reply being written (ChatApp)."""
        raise NotImplementedError

    async def action_new_chat(self) -> None:
        """Start a new chat (ChatApp)."""
        raise NotImplementedError

    async def action_regenerate(self) -> None:
        """Write the last reply again (ChatApp)."""
        raise NotImplementedError

    async def apply_settings(self, new: ChatSettings) -> None:
        """Use new settings, loading another model where they need one (ModelLoading)."""
        raise NotImplementedError

    def open_settings(self, settings: ChatSettings) -> None:
        """Show the settings dialog (ChatCommands)."""
        raise NotImplementedError

    def action_conversations(self) -> None:
        """List the saved chats (SavedChats)."""
        raise NotImplementedError

    def _save(self, write: HistoryWrite) -> None:
        """Write to the open chat's saved copy (SavedChats)."""
        raise NotImplementedError
