"""A target split over two rpc-servers on 127.0.0.1, each behind a latency proxy, drafted
locally: plain decoding, n-gram and a draft model at several added round-trip times.

Each decoding step crosses both servers one after the other, so it pays the round trip
twice; speculation shares those crossings among every token a step keeps, and the adaptive
controller, calibrated on the split target (network included), should draft longer as the
round trip grows. One table: tokens/s, speedup against plain decoding at the same latency,
the controller's mean draft length and acceptance.

    python benchmarks/rpc_bench.py --draft-model Q4_0                      # embedded target
    python benchmarks/rpc_bench.py --rtt-ms 0,5 --max-tokens 32 --repeats 1  # a quick look

Servers are `localspec rpc-server` unless --server-bin names llama.cpp's own rpc-server.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from localspec.backends.llamacpp.rpc_server import RpcServerError, probe
from localspec.control.prompts import SUITE
from localspec.core.backend_loader import load_backend
from localspec.tooling.bench import BenchPlan, BenchRow, Contender, bench

PROXY = Path(__file__).with_name("latency_proxy.py")
START_S = 60.0
STOP_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], endpoint: str) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            probe(endpoint, timeout=2.0)
            return
        except RpcServerError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


LOG_DIR = Path(tempfile.mkdtemp(prefix="rpc_bench-"))  # each server's and proxy's output


@contextlib.contextmanager
def processes(commands: Sequence[tuple[list[str], str]]) -> Iterator[None]:
    """Start each command, wait until its endpoint answers, stop them all afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for command, endpoint in commands:
            with open(LOG_DIR / f"{endpoint.replace(':', '_')}.log", "ab") as log:
                procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
            wait_ready(procs[-1], endpoint)
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()  # a process that ignores SIGTERM must not hold the table back
                proc.wait()


def server_command(port: int, threads: int, server_bin: str | None) -> list[str]:
    if server_bin:
        return [server_bin, "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads)]
    return [sys.executable, "-m", "localspec", "rpc-server", "--port", str(port), "--threads", str(threads)]


def proxy_command(port: int, upstream: int, rtt_ms: float) -> list[str]:
    listen, up = f"127.0.0.1:{port}", f"127.0.0.1:{upstream}"
    return [sys.executable, str(PROXY), "--listen", listen, "--upstream", up, "--delay-ms", str(rtt_ms / 2)]


def run_at(rtt_ms: float, servers: Sequence[int], args: argparse.Namespace) -> list[BenchRow]:
    proxies = [free_port() for _ in servers]
    commands = [(proxy_command(p, s, rtt_ms), f"127.0.0.1:{p}") for p, s in zip(proxies, servers, strict=True)]
    with processes(commands):
        rpc = tuple(f"127.0.0.1:{p}" for p in proxies)
        options = {"n_ctx": args.ctx, **({"threads": args.threads} if args.threads else {})}
        # Another proxy port is another server list, hence a calibration of this latency.
        target = load_backend("llamacpp", args.model, **options, rpc=rpc)
        drafts = []
        try:
            contenders = [Contender("ngram", "ngram")]
            if args.draft_model:
                drafts.append(load_backend("llamacpp", args.draft_model, **options))
                contenders.append(Contender("draft", "draft", drafts[-1]))
            prompts = [p for p in SUITE if p.id in args.prompts]
            return bench(target, contenders, prompts, BenchPlan(max_tokens=args.max_tokens, repeats=args.repeats))
        finally:
            for backend in [*drafts, target]:
                backend.close()


def table(results: Sequence[tuple[float, BenchRow]]) -> str:
    lines = [
        "| added RTT | prompt | strategy | plain tok/s | tok/s | speedup | mean γ | acceptance |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rtt, row in results:
        lines.append(
            f"| {rtt:g} ms | {row.prompt} | {row.strategy} | {row.plain_tokens_per_s:.1f} | "
            f"{row.spec_tokens_per_s:.1f} | {row.speedup:.2f}x | {row.mean_gamma:.1f} | {row.acceptance_rate:.0%} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", "-m", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--draft-model",
        help="drafter GGUF run locally, or a llama.cpp type (Q4_0) to derive one from the target "
        "(without it: plain and n-gram only)",
    )
    parser.add_argument("--rtt-ms", default="0,1,5,20", help="added round-trip times, comma-separated")
    parser.add_argument("--prompts", default="code_edit", help="suite prompt ids, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, help="local CPU threads")
    parser.add_argument("--server-threads", type=int, default=1, help="threads of each rpc-server (default 1)")
    parser.add_argument("--server-bin", help="llama.cpp's rpc-server (default: localspec rpc-server)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers and proxies too
    args.prompts = args.prompts.split(",")
    if args.model is None:
        from localspec.models.default_model import ensure_pypi_model

        args.model = str(ensure_pypi_model())
    if args.draft_model and not args.draft_model.endswith(".gguf"):
        from localspec.backends.llamacpp.copies import derived
        from localspec.store import data_dir

        args.draft_model = str(derived(args.model, args.draft_model, data_dir() / "derived"))
    print(f"servers' and proxies' logs: {LOG_DIR}", file=sys.stderr)
    servers = [free_port(), free_port()]
    results: list[tuple[float, BenchRow]] = []
    commands = [(server_command(s, args.server_threads, args.server_bin), f"127.0.0.1:{s}") for s in servers]
    with processes(commands):
        for rtt in (float(x) for x in args.rtt_ms.split(",")):
            print(f"added round trip {rtt:g} ms: calibrating the split target and decoding...", file=sys.stderr)
            results += [(rtt, row) for row in run_at(rtt, servers, args)]
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
