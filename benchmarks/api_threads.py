"""The Python API's decode speed from the threads an app calls it from: the thread that loaded
the model, a worker thread (a desktop app's UI thread loads, a worker answers), and
`astream()` in an asyncio loop (a Textual or asyncio app). First the loading thread alone,
before any other thread has asked; then the three ways in turn, round by round; fresh prompts
throughout. Each way's median decode tok/s and its ratio to the loading thread's alone.

    python benchmarks/api_threads.py [MODEL.gguf] [--threads 2] [--rounds 6] [--strategy none]

llama.cpp's CPU passes split over an OpenMP team that belongs to the calling thread; a second
living thread that runs passes slows every pass (backends/llamacpp/compute.py says why, and
`raw_loop.py threads` shows it without localspec).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import localspec
from localspec.backends.llamacpp import compute
from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model

TOPICS = ["a lighthouse keeper", "a bicycle", "the water cycle", "a mountain trip"]


def handoff_seconds() -> float:
    """One hand-over of a call that does nothing to the compute thread and back."""
    t0 = time.perf_counter()
    compute.run(2, int)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--strategy", default="none")
    args = parser.parse_args()
    model = args.model or str(ensure_pypi_model(quiet=True))
    runtime = localspec.load(model, threads=args.threads, strategy=args.strategy)
    worker = ThreadPoolExecutor(max_workers=1)
    asked = [0]

    def request() -> dict[str, object]:
        asked[0] += 1
        topic = TOPICS[asked[0] % len(TOPICS)]
        content = f"Request {asked[0]}. Write a long story about {topic}."
        return {"messages": [{"role": "user", "content": content}], "max_tokens": args.tokens, "temperature": 0}

    def generate() -> float:
        return runtime.generate(**request()).stats.decode_tokens_per_s  # type: ignore[arg-type]

    async def astream() -> float:
        rate = 0.0
        async for event in runtime.astream(**request()):  # type: ignore[arg-type]
            if isinstance(event, localspec.Finished):
                rate = event.stats.decode_tokens_per_s
        return rate

    ways: dict[str, Callable[[], float]] = {
        "generate() on the loading thread": generate,
        "generate() on a worker thread": lambda: worker.submit(generate).result(),
        "astream() in an asyncio loop": lambda: asyncio.run(astream()),
    }
    alone = "generate() on the loading thread, no other thread asked yet"
    generate()  # warm
    rates: dict[str, list[float]] = {alone: [generate() for _ in range(args.rounds)]}
    rates |= {name: [] for name in ways}
    for way in ways.values():
        way()  # warm: each thread's first request
    for _ in range(args.rounds):
        for name, way in ways.items():
            time.sleep(0.2)
            rates[name].append(way())
    runtime.close()
    handoff = statistics.median(handoff_seconds() for _ in range(2000)) * 1e6
    day = time.strftime("%Y-%m-%d")
    print(f"# the API's decode speed by calling thread: {host_kind()} host, {args.threads} threads, {day}\n")
    print(f"strategy {args.strategy}, {args.tokens} tokens, {args.rounds} rounds, the ways in turn\n")
    print("| called from | decode tok/s (median) | / the loading thread's alone |\n|---|---|---|")
    base = statistics.median(rates[alone])
    for name, got in rates.items():
        print(f"| {name} | {statistics.median(got):.1f} | {statistics.median(got) / base:.3f}x |")
    print(
        f"\nA pass's hand-over to the compute thread and back: {handoff:.0f} us (median of 2,000, nothing to compute)"
    )


if __name__ == "__main__":
    main()
