"""The chat's widgets: messages, the status line and the multi-line prompt."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Markdown, Static, TextArea
from textual.widgets._markdown import MarkdownStream

from localspec.tui.attribution import drafted_share

DRAFTED_STYLE = "bold #b5f4c0 on #1e4d2b"
STOPPED_NOTE = "Stopped: the reply was cut short here (Ctrl+R writes it again)."


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 6;
        padding: 0 1;
        background: $primary 15%;
        border-left: thick $primary;
    }
    """

    def __init__(self, text: str, attached: Sequence[str] = ()) -> None:
        # Attachments show as their labels ("image: photo.png") above the text.
        shown = "\n".join([*(f"[{label}]" for label in attached), text])
        super().__init__(shown, markup=False)
        self.text = text
        self.attached = tuple(attached)


class ErrorMessage(Static):
    DEFAULT_CSS = """
    ErrorMessage {
        margin: 1 0 0 0;
        padding: 0 1;
        color: $text-error;
        background: $error 10%;
        border-left: thick $error;
    }
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        body = Text(message, style="bold")
        if hint:
            body.append(f"\n→ {hint}", style="not bold")
        super().__init__(body)


class AssistantMessage(Vertical):
    """A reply: Markdown normally; its text with the drafted characters highlighted when the
    transcript shows drafts. Streams through Textual's MarkdownStream, which batches
    fragments when they arrive faster than they can be rendered."""

    SCOPED_CSS = False  # the draft view is switched by a class on an ancestor (the transcript)
    DEFAULT_CSS = """
    AssistantMessage {
        height: auto;
        margin: 1 6 0 0;
        padding: 0 1;
        border-left: thick $success 60%;
    }
    AssistantMessage > Markdown { margin: 0; padding: 0; }
    AssistantMessage > .drafts { display: none; }
    AssistantMessage > .note { color: $text-muted; }
    .-show-drafts AssistantMessage > Markdown { display: none; }
    .-show-drafts AssistantMessage > .drafts { display: block; }
    """

    def __init__(self, text: str = "", spans: Sequence[tuple[int, int]] = (), note: str = "") -> None:
        super().__init__()
        self.text = text
        self.spans: tuple[tuple[int, int], ...] = tuple(spans)
        self._note = note
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Markdown(self.text)
        yield Static(self._drafts_view(), classes="drafts")
        yield Static(self._note, classes="note", markup=False)

    def on_mount(self) -> None:
        self.query_one(".note", Static).display = bool(self._note)

    async def append(self, fragment: str, spans: Sequence[tuple[int, int]]) -> None:
        self.text += fragment
        self.spans = tuple(spans)
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write(fragment)
        if self.drafts_shown:
            self.refresh_drafts()

    async def finish(self, note: str = "") -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.set_note(note)
        self.refresh_drafts()

    def set_note(self, note: str) -> None:
        self._note = note
        label = self.query_one(".note", Static)
        label.update(note)
        label.display = bool(note)

    @property
    def drafts_shown(self) -> bool:
        return any(node.has_class("-show-drafts") for node in self.ancestors)

    def refresh_drafts(self) -> None:
        self.query_one(".drafts", Static).update(self._drafts_view())

    def _drafts_view(self) -> Text:
        view = Text(self.text)
        for start, end in self.spans:
            view.stylize(DRAFTED_STYLE, start, end)
        share = drafted_share(self.spans, len(self.text))
        view.append(f"\n{share:.0%} of this reply was drafted and accepted (highlighted)", style="dim italic")
        return view


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine {
        height: auto;
        max-height: 2;
        padding: 0 1;
        background: $panel;
        color: $text-muted;
    }
    StatusLine.-busy { color: $text; }
    StatusLine.-error { color: $text-error; }
    """

    def show(self, text: str, state: str = "") -> None:
        self.set_class(state == "busy", "-busy")
        self.set_class(state == "error", "-error")
        self.update(Text(text))


class PromptInput(TextArea):
    """Multi-line prompt: Enter sends; Shift+Enter, Alt+Enter or Ctrl+J start a new line."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 10;
        border: round $primary 50%;
    }
    PromptInput:focus { border: round $primary; }
    """

    NEWLINE_KEYS = ("shift+enter", "alt+enter", "ctrl+j")

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class PageKey(Message):
        def __init__(self, up: bool) -> None:
            super().__init__()
            self.up = up

    def __init__(self, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, placeholder=placeholder, id=id)
        self.highlight_cursor_line = False

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self.text))
            return
        if event.key in ("pageup", "pagedown"):  # the prompt is short: the keys scroll the chat above it
            event.stop()
            event.prevent_default()
            self.post_message(self.PageKey(event.key == "pageup"))
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)
