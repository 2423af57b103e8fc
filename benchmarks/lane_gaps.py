"""Lanes with an idle lane between them (issue #57, "ahead of llama-server at every N"): llama.cpp
evaluates separate streams together only in consecutive order, so a pass over lanes 0, 2 and 3
runs as two. backends/llamacpp/lanes.py fills such a gap with padding rows where one pass costs
less (sharing.gaps_to_fill); this measures that against leaving the split, in one process.

    python benchmarks/lane_gaps.py [--strategy none|ngram] [--rounds 6] [--threads 2]

Each round asks four clients at once for 128 tokens of the copying prompts (concurrency.py's),
once with gaps filled and once split, the order alternating, the same prompts both times (the
second run of a round finds its prompts cached, so runs are compared in the same position).
Printed: every pass's time by the lanes it held (gaps filled or split), and aggregate tokens/s
per round and position.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from concurrency import COPYING

import localspec
from localspec.backends.llamacpp import lanes
from localspec.control.hardware import host_kind

PASSES: list[tuple[tuple[int, ...], bool, float]] = []  # (lanes, any gap filled, seconds), decode passes only


def logged(run: Callable[[Any, list[Any]], None]) -> Callable[[Any, list[Any]], None]:
    def timed(host: Any, asks: list[Any]) -> None:
        filled, start = host.figures.filled_passes, time.perf_counter()
        run(host, asks)
        if max(len(ask.tokens) for ask in asks) == 1:  # plain steps: one row a lane
            PASSES.append(
                (
                    tuple(sorted(ask.lane.seq for ask in asks)),
                    host.figures.filled_passes > filled,
                    time.perf_counter() - start,
                )
            )

    return timed


def one_round(pool: localspec.Pool, asks: list[str]) -> float:
    out: list[Any] = [None] * len(asks)

    def ask(i: int) -> None:
        out[i] = pool.generate(messages=[{"role": "user", "content": asks[i]}], max_tokens=128, temperature=0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(o.stats.generated_tokens for o in out) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    fill = lanes.gaps_to_fill
    lanes.LaneHost._run = logged(lanes.LaneHost._run)  # type: ignore[method-assign]
    rates: dict[tuple[str, int], list[float]] = defaultdict(list)
    passes: dict[str, list[tuple[tuple[int, ...], bool, float]]] = defaultdict(list)
    with localspec.load_pool(strategy=args.strategy, parallel=4, threads=args.threads) as pool:
        pool.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)
        for r in range(args.rounds):
            order = ("filled", "split") if r % 2 == 0 else ("split", "filled")
            for position, mode in enumerate(order):
                lanes.gaps_to_fill = fill if mode == "filled" else (lambda *_: [])  # type: ignore[assignment]
                PASSES.clear()
                rates[(mode, position)].append(one_round(pool, [f"Request {r + 1}. {p}" for p in COPYING]))
                passes[mode] += PASSES
    print(
        f"# lane gaps: {host_kind()} host, {args.threads} threads, --strategy {args.strategy}, {args.rounds} rounds\n"
    )
    print("| plain steps of lanes | gaps | passes | ms a pass (median) |\n|---|---|---|---|")
    for mode, rows in passes.items():
        by: dict[tuple[tuple[int, ...], bool], list[float]] = defaultdict(list)
        for seqs, filled, seconds in rows:
            by[(seqs, filled)].append(seconds)
        for (seqs, filled), times in sorted(by.items(), key=lambda kv: -len(kv[1]))[:6]:
            gap = "filled" if filled else ("split by llama.cpp" if seqs[-1] - seqs[0] + 1 > len(seqs) else "none")
            print(f"| {seqs} ({mode} run) | {gap} | {len(times)} | {1e3 * statistics.median(times):.1f} |")
    print("\n| run | first in its round, tok/s | second (prompts cached) |\n|---|---|---|")
    for mode in ("filled", "split"):
        cells = [", ".join(f"{x:.1f}" for x in rates[(mode, p)]) for p in (0, 1)]
        print(f"| {mode} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
