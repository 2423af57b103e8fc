"""An asyncio app: stream an answer, cancel it midway with task.cancel(), ask a follow-up.

    python examples/asyncio_stream.py

The runtime waits for its turn and runs each step in a thread of its own, so the event loop
(here a ticker standing in for a UI) keeps running the whole time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import localspec


@dataclass
class Outcome:
    streamed: str = ""  # what came before the cancel
    cancelled: bool = False
    follow_up: localspec.Completion | None = None
    ticks: list[int] = field(default_factory=list)  # the ticker's count at each delta: it ran on


async def main(rt: localspec.Runtime, deltas_before_cancel: int = 3, max_tokens: int = 16) -> Outcome:
    out = Outcome()
    ticks = 0
    enough = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    async def answer() -> None:
        chat = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]
        async for event in rt.astream(messages=chat, max_tokens=512, temperature=0):
            if isinstance(event, localspec.TextDelta):
                out.streamed += event.text
                out.ticks.append(ticks)
                print(event.text, end="", flush=True)
                if len(out.ticks) >= deltas_before_cancel:
                    enough.set()

    ticker = asyncio.create_task(tick())
    task = asyncio.create_task(answer())
    await enough.wait()
    task.cancel()  # stops the request at its next step; no Event to pass around
    try:
        await task
    except asyncio.CancelledError:
        out.cancelled = True
    print("\n[cancelled]")
    follow = [{"role": "user", "content": "Then name the lighthouse, in three words."}]
    out.follow_up = await rt.agenerate(messages=follow, max_tokens=max_tokens, temperature=0)
    print(out.follow_up.text, f"({out.follow_up.finish_reason})")
    ticker.cancel()
    return out


if __name__ == "__main__":
    with localspec.load() as runtime:
        asyncio.run(main(runtime))
