"""The chat app on the real default model (SmolLM2-135M-Instruct through llama.cpp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.api import Runtime, load
from localspec.common.progress import Announce
from localspec.testing.tui_support import answered, ready, replies, send, wait_for
from localspec.tui import ChatApp, ChatSettings

pytestmark = pytest.mark.model
# Loading calibrates the model on this machine once (a second on an idle 2-core CPU, much
# longer when other work shares it); conditions wait generously and never on a fixed delay.
LOAD_TIMEOUT = 600.0
REPLY_TIMEOUT = 300.0


def real_app(model: Path, **settings: object) -> ChatApp:
    def loader(s: ChatSettings, on_progress: Announce | None) -> Runtime:
        return load(s.load, on_progress=on_progress)

    return ChatApp(loader, ChatSettings().with_changes(model=str(model), n_ctx=2048).with_changes(**settings))


@pytest.mark.asyncio
async def test_the_default_model_answers_a_typed_question(smollm2_q4_1: Path) -> None:
    app = real_app(smollm2_q4_1, temperature=0.0, max_tokens=48)
    async with app.run_test(size=(100, 32)) as pilot:
        await ready(app, LOAD_TIMEOUT)
        await send(app, pilot, "Name three colors.")
        await answered(app, timeout=REPLY_TIMEOUT)
        assert {"red", "blue", "green"} & set(replies(app)[0].lower().replace(".", " ").split())
        assert "est." in str(app.status.render())


@pytest.mark.asyncio
async def test_esc_stops_the_real_model_mid_reply_and_it_answers_again(smollm2_q4_1: Path) -> None:
    app = real_app(smollm2_q4_1, temperature=0.0, max_tokens=400, strategy="ngram")
    async with app.run_test(size=(100, 32)) as pilot:
        await ready(app, LOAD_TIMEOUT)
        await send(app, pilot, "Write a long story about a dragon who learns to bake bread.")
        await wait_for(
            lambda: app.turn is not None and len(app.turn.reply.text) > 20, REPLY_TIMEOUT, what="the story to start"
        )
        job = app.turn.job  # type: ignore[union-attr]
        await pilot.press("escape")
        assert app.turn is None and len(replies(app)[0]) > 20  # Esc keeps what was written
        await wait_for(job.released.is_set, REPLY_TIMEOUT, what="the runtime to be released")
        app.prompt.clear()
        app.settings = app.settings.with_changes(max_tokens=24)
        await send(app, pilot, "Say hello.")
        await answered(app, timeout=REPLY_TIMEOUT)
        assert replies(app)[0].strip()
