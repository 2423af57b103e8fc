"""Helpers shared by the chat app's tests: runtimes on the reference backend, a slowed copy of
it (so a reply is still streaming when a test presses Esc), and waiting on conditions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from localspec.api import Runtime, runtime_for
from localspec.common.progress import Announce
from localspec.core.backend_loader import load_backend
from localspec.core.sampling import SamplingConfig
from localspec.tui import ChatApp, ChatSettings
from localspec.tui.models import RuntimeLoader

REFERENCE = ChatSettings().with_changes(
    model="reference",
    backend="reference",
    strategy="draft",
    draft_model="reference:noise=0.3",
    sampling=SamplingConfig(temperature=0.0),
)


def reference_runtime(settings: ChatSettings, on_progress: Announce | None = None) -> Runtime:
    """What `localspec chat reference --backend reference ...` loads: the reference target,
    and the noisy reference drafter when the strategy drafts with a model."""
    target = load_backend("reference", settings.load.model or "reference", n_ctx=settings.load.n_ctx)
    uses_drafter = settings.load.draft_model is not None and settings.load.strategy in ("draft", "auto")
    draft = load_backend("reference", settings.load.draft_model, n_ctx=settings.load.n_ctx) if uses_drafter else None  # type: ignore[arg-type]
    return runtime_for(target, draft, strategy=settings.load.strategy, draft_tokens=settings.load.draft_tokens)


def reference(strategy: str = "auto", draft_tokens: int | str = "auto", n_ctx: int = 2048, **kw: Any) -> Runtime:
    """A runtime on the reference model alone, for tests below the UI."""
    target = load_backend("reference", "reference", n_ctx=n_ctx)
    return runtime_for(target, None, strategy=strategy, draft_tokens=draft_tokens, **kw)  # type: ignore[arg-type]


class SlowBackend:
    """The reference model with every pass taking at least `delay` seconds, like a real model,
    and no end-of-turn token: it writes until max_tokens, so a test can interrupt it."""

    def __init__(self, spec: str, delay: float) -> None:
        self._inner = load_backend("reference", spec, n_ctx=4096)
        self.delay = delay

    def eval_block(self, tokens: Any, logits: Any = "all") -> Any:
        time.sleep(self.delay)
        return self._inner.eval_block(tokens, logits)

    def end_of_generation(self) -> frozenset[int]:
        return frozenset()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def slow_runtime(delay: float = 0.01) -> RuntimeLoader:
    def make(settings: ChatSettings, on_progress: Announce | None = None) -> Runtime:
        target = SlowBackend("reference", delay)
        return runtime_for(target, None, strategy="ngram", draft_tokens=4, calibrate=False)  # type: ignore[arg-type]

    return make


async def wait_for(condition: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll a condition while the app runs; the CPU is shared, so the timeout is generous."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def ready(app: ChatApp, timeout: float = 30.0) -> None:
    def loaded() -> bool:
        if app.runtime is None and not app.loading and "Could not load" in str(app.status.render()):
            raise AssertionError(f"the app could not load its model: {app.status.render()}")
        return app.runtime is not None and not app.loading

    await wait_for(loaded, timeout, what="the model to load")


def replies(app: ChatApp) -> list[str]:
    return [m["content"] for m in app.messages if m["role"] == "assistant"]


async def send(app: ChatApp, pilot: Any, text: str) -> None:
    """Type a prompt as a user would and press Enter."""
    app.prompt.focus()
    await pilot.press(*text)
    await pilot.press("enter")


async def paste(app: ChatApp, pilot: Any, text: str) -> None:
    """Paste a prompt as a user would and press Enter: one event, where typing a long prompt
    key by key takes a frame a key."""
    from textual import events

    app.prompt.focus()
    app.post_message(events.Paste(text))  # the app hands it to the focused prompt
    await pilot.pause()
    await pilot.press("enter")


async def answered(app: ChatApp, count: int = 1, timeout: float = 30.0) -> None:
    await wait_for(lambda: app.turn is None and len(replies(app)) >= count, timeout, what=f"{count} replies")
