"""The chat's dialogs: settings, saved conversations, a failed load, fetching a model."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, ProgressBar, Select, Static
from textual.widgets.option_list import Option

from localspec.core.choices import SELF_DRAFTING, STRATEGIES, parse_draft_tokens
from localspec.core.errors import LocalspecError
from localspec.tui.history import ConversationSummary
from localspec.tui.models import MissingModel
from localspec.tui.settings import ChatSettings, parse_temperature

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical, {name} > VerticalScroll {{
    width: 84;
    max-width: 95%;
    height: auto;
    max-height: 90%;
    padding: 1 2;
    border: thick $primary 60%;
    background: $surface;
}}
{name} .title {{ text-style: bold; margin-bottom: 1; }}
{name} .hint {{ color: $text-muted; }}
{name} .error {{ color: $text-error; }}
{name} .buttons {{ height: auto; margin-top: 1; align-horizontal: right; }}
{name} .buttons Button {{ margin-left: 1; }}
"""


def strategy_choices(current: str) -> list[str]:
    """The strategies load() knows, and the current one if it is another (e.g. qspec:Q4_0)."""
    choices = [*STRATEGIES, *SELF_DRAFTING]
    if current not in choices:
        choices.append(current)
    return choices


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Pair, strategy, draft length, temperature and system prompt."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="SettingsScreen")
        + """
    SettingsScreen Label { margin-top: 1; color: $text-muted; }
    SettingsScreen Input, SettingsScreen Select { width: 100%; }
    SettingsScreen Input { background: $boost; }
    SettingsScreen Input:focus { background: $primary 20%; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with VerticalScroll():
            yield Static("Settings", classes="title")
            yield Label("Model: a pair name from `localspec list` or a GGUF path (empty: the default)")
            yield Input(s.load.model or "", placeholder="default: smollm2-135m", id="model", compact=True)
            yield Label("Draft model (GGUF with the target's tokenizer; for strategy 'draft')")
            yield Input(s.load.draft_model or "", placeholder="none", id="draft-model", compact=True)
            yield Label("Strategy")
            options = [(name, name) for name in strategy_choices(s.load.strategy)]
            yield Select(options, value=s.load.strategy, allow_blank=False, id="strategy", compact=True)
            yield Label("Draft length: auto (adapts to this machine and the text) or a fixed number")
            yield Input(str(s.load.draft_tokens), id="draft-tokens", compact=True)
            yield Label("Temperature (0 = greedy)")
            yield Input(f"{s.sampling.temperature:g}", id="temperature", compact=True)
            yield Label("System prompt")
            yield Input(s.system, placeholder="none", id="system", compact=True)
            yield Static("", classes="error", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Apply", variant="primary", id="apply")

    def on_mount(self) -> None:
        self.query_one("#model", Input).focus()  # a field to type in, not Apply (Enter in any field applies)

    @on(Button.Pressed, "#apply")
    @on(Input.Submitted)
    def apply(self) -> None:
        try:
            self.dismiss(self._read())
        except LocalspecError as exc:
            self.query_one("#settings-error", Static).update(exc.message)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)

    def _read(self) -> ChatSettings:
        def text(widget_id: str) -> str:
            return self.query_one(f"#{widget_id}", Input).value.strip()

        strategy = self.query_one("#strategy", Select).value
        return self.settings.with_changes(
            model=text("model") or None,
            draft_model=text("draft-model") or None,
            strategy=str(strategy),
            draft_tokens=parse_draft_tokens(text("draft-tokens")),
            temperature=parse_temperature(text("temperature")),
            system=self.query_one("#system", Input).value,
        )


class ConversationsScreen(ModalScreen[int | None]):
    """Saved conversations, newest first: Enter opens one, Delete removes it."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="ConversationsScreen")
        + """
    ConversationsScreen OptionList { height: auto; max-height: 20; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Close"),
        Binding("delete", "delete", "Delete chat"),
    ]

    def __init__(self, conversations: list[ConversationSummary], notice: str | None = None) -> None:
        super().__init__()
        self.conversations = conversations
        self.notice = notice
        self.deleted: list[int] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Saved chats", classes="title")
            if self.notice:
                yield Static(self.notice, classes="error", markup=False)
            if not self.conversations:
                yield Static("No saved chats yet: every chat is saved as you go.", classes="hint")
            yield OptionList(*(self._option(c) for c in self.conversations), id="conversations")
            yield Static("Enter opens · Delete removes · Esc closes", classes="hint")

    @staticmethod
    def _option(c: ConversationSummary) -> Option:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
        label = Text(c.title or "(untitled)", style="bold")
        label.append(f"\n  {when} · {c.n_messages} messages · {c.model}", style="dim")
        return Option(label, id=str(c.id))

    @on(OptionList.OptionSelected)
    def open(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        index = options.highlighted
        if index is None:
            return
        option_id = options.get_option_at_index(index).id
        if option_id is not None:
            self.deleted.append(int(option_id))
            options.remove_option_at_index(index)

    def action_cancel(self) -> None:
        self.dismiss(None)


class LoadErrorScreen(ModalScreen[str]):
    """A model that failed to load: what went wrong, what to do, and the ways on."""

    DEFAULT_CSS = DIALOG_CSS.format(name="LoadErrorScreen")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "choose('settings')", "Settings")]

    def __init__(self, settings: ChatSettings, error: BaseException) -> None:
        super().__init__()
        self.settings = settings
        self.error = error

    def compose(self) -> ComposeResult:
        message = self.error.message if isinstance(self.error, LocalspecError) else f"unexpected error: {self.error!r}"
        hint = self.error.hint if isinstance(self.error, LocalspecError) else None
        with Vertical():
            yield Static(f"Could not load {self.settings.model_label()}", classes="title")
            yield Static(message, classes="error", markup=False)
            if hint:
                yield Static(f"→ {hint}", markup=False)
            yield Static("Open the settings to pick another model or strategy, or try again.", classes="hint")
            with Horizontal(classes="buttons"):
                yield Button("Quit", id="quit")
                yield Button("Retry", id="retry")
                yield Button("Settings", variant="primary", id="settings")

    def on_mount(self) -> None:
        self.query_one("#settings", Button).focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "settings")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)


class FetchScreen(ModalScreen[bool]):
    """Offers to fetch a missing model, then shows the fetch's progress."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="FetchScreen")
        + """
    FetchScreen ProgressBar { margin-top: 1; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "decline", "Not now")]

    def __init__(self, missing: MissingModel) -> None:
        super().__init__()
        self.missing = missing

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Model not downloaded", classes="title")
            yield Static(self.missing.description, markup=False)
            yield ProgressBar(id="fetch-progress", show_eta=False)
            yield Static("", id="fetch-status", classes="hint", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Not now", id="decline")
                yield Button("Download", variant="primary", id="download")

    def on_mount(self) -> None:
        self.query_one(ProgressBar).display = False
        self.query_one("#download", Button).focus()

    @on(Button.Pressed, "#download")
    def download(self) -> None:
        self.query_one("#download", Button).disabled = True
        self.query_one(ProgressBar).display = True
        self._fetch()

    @on(Button.Pressed, "#decline")
    def action_decline(self) -> None:
        self.dismiss(False)

    @work(thread=True, exclusive=True, group="fetch")
    def _fetch(self) -> None:
        try:
            self.missing.fetch(self._progress)
        except Exception as exc:
            self.app.call_from_thread(self._failed, exc)
        else:
            self.app.call_from_thread(self.dismiss, True)

    def _progress(self, done: float | None, total: float | None, what: str) -> None:
        self.app.call_from_thread(self._show_progress, done, total, what)

    def _show_progress(self, done: float | None, total: float | None, what: str) -> None:
        bar = self.query_one(ProgressBar)
        kwargs: dict[str, Any] = {"total": total}
        if done is not None:
            kwargs["progress"] = done
        bar.update(**kwargs)
        self.query_one("#fetch-status", Static).update(what)

    def _failed(self, exc: BaseException) -> None:
        text = str(exc) if isinstance(exc, LocalspecError) else f"unexpected error: {exc!r}"
        self.query_one("#fetch-status", Static).update(Text(text, style="bold red"))
        self.query_one(ProgressBar).display = False
        button = self.query_one("#download", Button)
        button.label = "Retry"
        button.disabled = False
