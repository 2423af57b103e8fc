"""The examples an app developer copies (examples/), run against the real default model:
an asyncio streamer that cancels and asks a follow-up, a Textual app with a worker thread,
a timer and a title asked from the UI at the same time, a tool call and a pydantic-schema answer
in-process (issue 56)."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from types import ModuleType

import pytest
from repo_paths import ROOT

from localspec.api import Runtime, runtime_for
from localspec.core.protocol import Backend

pytestmark = pytest.mark.model
EXAMPLES = ROOT / "examples"
BOUND_SECONDS = 120  # a bound, not a timing: each example answers a few dozen tokens


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rt(target_backend: Backend) -> Runtime:
    """The default model as load() runs it (n-gram lookup); closing it is the session's job."""
    return runtime_for(target_backend, strategy="ngram", calibrate=False)


@pytest.mark.asyncio
async def test_the_asyncio_example_streams_cancels_and_answers_a_follow_up(rt: Runtime) -> None:
    out = await example("asyncio_stream").main(rt, deltas_before_cancel=6, max_tokens=8)

    assert out.cancelled and out.streamed
    assert out.ticks[-1] > out.ticks[0]  # the loop ran while the answer streamed
    assert out.follow_up is not None and out.follow_up.text and out.follow_up.finish_reason in ("stop", "max_tokens")
    assert not rt.busy


async def until(pilot: object, condition: Callable[[], bool]) -> bool:
    """Let the app run until condition holds (or the bound passes)."""
    deadline = time.monotonic() + BOUND_SECONDS
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.02)  # type: ignore[attr-defined]
    return condition()


@pytest.mark.asyncio
async def test_the_textual_example_streams_from_a_worker_while_the_ui_asks_and_stops(rt: Runtime) -> None:
    app = example("textual_app").Assistant(rt, max_tokens=400)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await until(pilot, lambda: bool(app.answer))
        await pilot.press("t")  # the title waits behind the answer, the UI runs on
        assert await until(pilot, lambda: rt.waiting == 1)
        await pilot.press("escape")  # close() from the UI thread stops the worker's answer
        assert await until(pilot, lambda: bool(app.finish_reason and app.story_title))

    assert app.finish_reason == "cancelled"
    assert app.busy_ticks > 0 and not rt.busy


def test_the_tools_and_schema_example_calls_a_tool_and_answers_in_the_schema(rt: Runtime) -> None:
    out = example("tools_and_schema").main(rt, max_tokens=48)

    assert out.weather.unit in ("celsius", "fahrenheit") and out.weather.city
    assert out.reply  # the model answered once the tool's result was in the chat
    assert out.city.name and out.city.country  # parsed by pydantic: it validated
    assert not rt.busy
