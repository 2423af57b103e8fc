"""A desktop-style assistant in Textual: the answer streams from a worker thread, a timer
shows whether the runtime is busy, and a title is asked for at the same time from the UI.

    python examples/textual_app.py      (t: ask for a title, escape: stop the answer, q: quit)

The rule it follows (docs/python-api.md "Threads and asyncio"): read a stream from one
thread (the worker); stop it from any thread with close(); never wait for the runtime on the
UI thread: ask `rt.busy`, or use the async API (agenerate), which waits in a thread of its own.
"""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.widgets import Footer, Static

import localspec

QUESTION = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


class Assistant(App[None]):
    BINDINGS: ClassVar[list[BindingType]] = [("t", "title", "title"), ("escape", "stop", "stop"), ("q", "quit", "quit")]

    def __init__(self, rt: localspec.Runtime, max_tokens: int = 200) -> None:
        super().__init__()
        self.rt = rt
        self.max_tokens = max_tokens
        self.stream: localspec.Stream | None = None
        self.answer = ""
        self.finish_reason = ""  # the answer's Finished, once it came
        self.story_title = ""
        self.busy_ticks = 0  # timer ticks that saw the runtime busy: the UI ran on meanwhile

    def compose(self) -> ComposeResult:
        # Kept, not queried: the timer may tick once more while the app closes, after its screen
        # has gone, where query_one finds nothing and raises.
        self.status, self.title_line, self.answer_text = Static(""), Static(""), Static("")
        yield self.status
        yield self.title_line
        yield self.answer_text
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(0.02, self.show_status)
        self.read_answer()

    def show_status(self) -> None:
        busy = self.rt.busy  # answers at once, even while a step runs
        self.busy_ticks += busy
        waiting = f", {self.rt.waiting} waiting" if self.rt.waiting else ""
        self.status.update(("busy" + waiting) if busy else "idle")

    @work(thread=True)
    def read_answer(self) -> None:
        # stream() may wait for the runtime: in the worker, never on the UI thread.
        self.stream = stream = self.rt.stream(messages=QUESTION, max_tokens=self.max_tokens, temperature=0)
        for event in stream:  # one thread reads; every stream ends with one Finished
            if isinstance(event, localspec.TextDelta):
                self.call_from_thread(self.add_text, event.text)
            else:
                self.call_from_thread(self.finished, event.finish_reason)

    def add_text(self, text: str) -> None:
        self.answer += text
        self.answer_text.update(self.answer)

    def finished(self, reason: str) -> None:
        self.finish_reason = reason
        self.answer_text.update(f"{self.answer}\n[{reason}]")

    def action_stop(self) -> None:
        if self.stream is not None:
            self.stream.close()  # from the UI thread: the worker gets Finished("cancelled") next

    @work
    async def action_title(self) -> None:
        # Waits behind the answer in its own thread: the UI is not blocked meanwhile.
        ask = [{"role": "user", "content": "Give a three-word title for a story about a lighthouse keeper."}]
        title = await self.rt.agenerate(messages=ask, max_tokens=8, temperature=0)
        self.story_title = title.text.strip() or "(no title)"
        self.title_line.update(self.story_title)


if __name__ == "__main__":
    with localspec.load() as runtime:
        Assistant(runtime).run()
