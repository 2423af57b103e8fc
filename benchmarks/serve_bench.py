"""`localspec serve` against the in-process API on the same prompts and model: decode tok/s
through HTTP streaming (goal >= 0.97x), time to first token, time to first token for a
returning conversation against a new one and against two interleaved conversations, and
total throughput with 1 and with 4 concurrent clients.

The server runs in its own process (`localspec serve --port 0`), as clients meet it.

    python benchmarks/serve_bench.py                          # the embedded default
    python benchmarks/serve_bench.py --model smollm2-1.7b --max-tokens 256
    python benchmarks/serve_bench.py --max-tokens 8 --prompts 2 --repeats 1 --draft-tokens 4   # a quick check
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from localspec.api import TextDelta, load

PROMPTS = [
    "Explain how a refrigerator keeps food cold, step by step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List ten tips for writing clear Python code, with one sentence on each.",
    "Describe the water cycle to a ten-year-old.",
    "What are the differences between a list and a tuple in Python? Give examples.",
    "Summarize the causes of the French Revolution in a paragraph.",
    "Give a recipe for pancakes with quantities and steps.",
    "Explain what a hash table is and why lookups are fast.",
]


@dataclass
class Timing:
    ttft: float  # seconds to the first text
    decode_tps: float  # tokens after the first, per second after the first
    tokens: int


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# -- in-process ----------------------------------------------------------------------------------


def api_timing(runtime: Any, messages: list[dict[str, str]], max_tokens: int) -> tuple[Timing, str]:
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    text = []
    for event in runtime.stream(messages=messages, max_tokens=max_tokens, temperature=0):
        if isinstance(event, TextDelta):
            now = time.perf_counter()
            if event.text and not first:
                first = now
            tokens += len(event.tokens)
            last = now
            text.append(event.text)
    return _timing(start, first, last, tokens), "".join(text)


def _timing(start: float, first: float, last: float, tokens: int) -> Timing:
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return Timing(first - start, decode, tokens)


# -- over HTTP -----------------------------------------------------------------------------------


def http_timing(client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[Timing, str]:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    text = []
    with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                text.append(chunk["choices"][0]["delta"]["content"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return _timing(start, first, last, tokens), "".join(text)


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


def start_server(args: argparse.Namespace) -> Server:
    command = [sys.executable, "-m", "localspec", "serve", "--port", "0", "--ctx", str(args.ctx)]
    command += ["--backend", args.backend, "--draft-tokens", str(args.draft_tokens)] + (
        [args.model] if args.model else []
    )
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"at (http://\S+/v1)", line)
        if found:
            # Keep reading the request log so the server never blocks on a full pipe.
            threading.Thread(target=process.stderr.read, daemon=True).start()
            url = found.group(1)
            # It listens before its model is loaded: time nothing until it says it is ready.
            while httpx.get(url.removesuffix("/v1") + "/health", timeout=600).status_code != 200:
                time.sleep(0.05)
            return Server(process, url)
    raise SystemExit(f"the server did not start (exit code {process.wait()})")


# -- the table -----------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def conversation(prompt: str, answer: str, follow_up: str) -> list[dict[str, str]]:
    return [*user(prompt), {"role": "assistant", "content": answer}, *user(follow_up)]


def ttft_returning(
    fetch: Callable[[list[dict[str, str]]], tuple[Timing, str]], prompts: Sequence[str]
) -> dict[str, float]:
    """Second turns: right after their own first turn (the cache holds the conversation),
    of a conversation not seen before, and interleaved with another conversation."""
    follow_up = "Now say that again in one sentence."
    returning, new, interleaved = [], [], []
    for i, prompt in enumerate(prompts):
        other = prompts[(i + 1) % len(prompts)]
        _, answer = fetch(user(prompt))
        returning.append(fetch(conversation(prompt, answer, follow_up))[0].ttft)
        _, other_answer = fetch(user(other))
        fetch(user(prompt + " Be brief."))  # something else fills the cache in between
        new.append(fetch(conversation(other, other_answer, follow_up))[0].ttft)
        _, answer = fetch(user(prompt))
        fetch(user(other))  # another conversation's turn comes between ours
        interleaved.append(fetch(conversation(prompt, answer, follow_up))[0].ttft)
    return {"returning": median(returning), "new": median(new), "interleaved": median(interleaved)}


def throughput(url: str, prompts: Sequence[str], max_tokens: int, clients: int) -> float:
    """Generated tokens per wall second with `clients` streaming at once."""
    jobs = [prompts[i % len(prompts)] for i in range(max(len(prompts), 2 * clients))]

    def one(prompt: str) -> int:
        with httpx.Client(timeout=600) as client:
            return http_timing(client, url, user(prompt), max_tokens)[0].tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, jobs))
    return tokens / (time.perf_counter() - start)


def rows(args: argparse.Namespace) -> Iterator[tuple[str, str, str, str]]:
    prompts = PROMPTS[: args.prompts]
    runtime = load(args.model, backend=args.backend, n_ctx=args.ctx, draft_tokens=args.draft_tokens)
    with runtime:
        api_text = {p: api_timing(runtime, user(p), args.max_tokens)[1] for p in prompts}  # warm-up, reference
        api = [api_timing(runtime, user(p), args.max_tokens)[0] for p in prompts for _ in range(args.repeats)]
        api_turns = ttft_returning(lambda m: api_timing(runtime, m, args.max_tokens), prompts)
    server = start_server(args)
    try:
        with httpx.Client(timeout=600) as client:
            same = all(http_timing(client, server.url, user(p), args.max_tokens)[1] == api_text[p] for p in prompts)
            http = [
                http_timing(client, server.url, user(p), args.max_tokens)[0]
                for p in prompts
                for _ in range(args.repeats)
            ]
            http_turns = ttft_returning(lambda m: http_timing(client, server.url, m, args.max_tokens), prompts)
        one_client = throughput(server.url, prompts, args.max_tokens, 1)
        four_clients = throughput(server.url, prompts, args.max_tokens, 4)
    finally:
        code = server.stop()
    api_tps, http_tps = median([t.decode_tps for t in api]), median([t.decode_tps for t in http])
    yield (
        "decode tok/s (median)",
        f"{api_tps:.1f}",
        f"{http_tps:.1f}",
        f"{http_tps / api_tps:.3f}x" if api_tps else "-",
    )
    api_ttft, http_ttft = median([t.ttft for t in api]), median([t.ttft for t in http])
    yield (
        "time to first token, ms",
        f"{api_ttft * 1e3:.1f}",
        f"{http_ttft * 1e3:.1f}",
        f"{(http_ttft - api_ttft) * 1e3:+.1f} ms",
    )
    for kind in ("new", "returning", "interleaved"):
        a, h = api_turns[kind], http_turns[kind]
        yield (f"TTFT second turn, {kind} conversation, ms", f"{a * 1e3:.1f}", f"{h * 1e3:.1f}", "")
    yield ("throughput tok/s, 1 client", "", f"{one_client:.1f}", "")
    yield ("throughput tok/s, 4 clients", "", f"{four_clients:.1f}", f"{four_clients / one_client:.2f}x of 1")
    yield ("greedy text identical to the API", "", "yes" if same else "NO", "")
    yield ("server exit code after SIGTERM", "", str(code), "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a pulled pair or a GGUF file (default: the embedded default)")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many prompts (1-{len(PROMPTS)})")
    parser.add_argument("--repeats", type=int, default=2, help="decode runs per prompt and side")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument(
        "--draft-tokens",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="as `localspec serve --draft-tokens` (a number skips the first calibration: a quick check)",
    )
    args = parser.parse_args(argv)
    table = [("", "in-process API", "HTTP (localspec serve)", "HTTP / API"), *rows(args)]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
