"""`localspec serve` against `llama-server` on fresh text, one server at a time (issue #57
item 8): the same greedy chat requests of 128 tokens, each server started in turn for a
round, rounds alternated; the median request's tokens/s over its whole wall time (prompt,
decoding and HTTP), and each server's own decode rate (localspec's `speculation` figures,
llama-server's `timings`).

    python benchmarks/serve_decode.py --llama-server BIN/llama-server [--threads 1] [--rounds 3]

Both run plain decoding (localspec `-s none --parallel 1 --no-memory`, llama-server
`--parallel 1`), so only the serving paths and the decoding loops differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import httpx
from concurrency import Server, start  # the same server starter as the concurrency benchmark

from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model

PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain how a bicycle works, in detail.",
    "Describe the water cycle for a ten-year-old.",
    "Write a letter to a friend about a trip to the mountains.",
]


def ask(base: str, prompt: str) -> tuple[float, float]:
    """Tokens/s over the request's wall time, and the server's own decode rate."""
    model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "temperature": 0}
    t0 = time.perf_counter()
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).json()
    wall = time.perf_counter() - t0
    tokens = reply["usage"]["completion_tokens"]
    timings = reply.get("timings") or {}
    own = timings["predicted_per_second"] if timings else reply["speculation"]["decode_tokens_per_s"]
    return tokens / wall, float(own)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model, t = str(ensure_pypi_model()), str(args.threads)
    ours = [sys.executable, "-m", "localspec", "serve", "--model", model, "--threads", t, "--no-memory"]
    theirs = [args.llama_server, "-m", model, "-t", t, "-tb", t, "-c", "4096", "--jinja", "--parallel", "1"]
    servers = [
        Server("localspec serve", lambda p: [*ours, "--parallel", "1", "-s", "none", "--port", str(p)]),
        Server("llama-server", lambda p: [*theirs, "--port", str(p)]),
    ]
    walls: dict[str, list[float]] = {s.name: [] for s in servers}
    owns: dict[str, list[float]] = {s.name: [] for s in servers}
    for r in range(args.rounds):
        for server in servers if r % 2 == 0 else servers[::-1]:
            proc, base = start(server)
            try:
                ask(base, "Say hello.")  # warm
                for prompt in PROMPTS:
                    wall, own = ask(base, prompt)
                    walls[server.name].append(wall)
                    owns[server.name].append(own)
            finally:
                proc.kill()
                proc.wait()
    day = time.strftime("%Y-%m-%d")
    print(f"# serve against llama-server on fresh text: {host_kind()} host, {args.threads} thread(s), {day}\n")
    print("| server | tok/s over the request | its own decode tok/s |\n|---|---|---|")
    for name in walls:
        print(f"| {name} | {statistics.median(walls[name]):.1f} | {statistics.median(owns[name]):.1f} |")
    a, b = (statistics.median(walls[s.name]) for s in servers)
    print(f"\nlocalspec / llama-server over the request: **{a / b:.3f}x** (median of {len(walls[servers[0].name])})")


if __name__ == "__main__":
    main()
