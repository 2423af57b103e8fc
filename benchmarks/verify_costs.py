"""What a llama.cpp verify pass costs, in the ways the draft-length controller cares about:
t_verify(k) behind texts of several lengths, the same at one thread, the price of changing
the block size between passes, and the passes of a real n-gram run against the calibrated
curve's prediction.

    python benchmarks/verify_costs.py MODEL.gguf [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence

from localspec.api import load
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.control.prompts import SUITE
from localspec.core.stats import Step

TEXT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n  The quick brown fox jumps. " * 120
SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)
DEPTHS = (32, 128, 256, 512, 1024)


def timed(backend: LlamaCppBackend, block: Sequence[int]) -> float:
    past = backend.n_past
    t0 = time.perf_counter()
    backend.eval_block(block, "all")
    seconds = time.perf_counter() - t0
    backend.rollback(past)
    return seconds


def behind(backend: LlamaCppBackend, tokens: list[int], depth: int) -> None:
    backend.rollback(0)
    for start in range(0, depth, 256):
        backend.eval_block(tokens[start : min(depth, start + 256)], "none")


def curves(model: str, repeats: int, threads: int | None) -> None:
    backend = LlamaCppBackend(model, threads=threads)
    tokens = backend.tokenize(TEXT, add_special=True, parse_special=False)
    print(f"t_verify(k) in ms, {backend.capabilities.extra['threads']} threads, median of {repeats} rounds")
    print("depth " + " ".join(f"{k:>6}" for k in SIZES))
    for depth in DEPTHS if threads is None else DEPTHS[:1]:
        behind(backend, tokens, depth)
        probe = tokens[depth : depth + max(SIZES)]
        timed(backend, probe[:4])  # warm up
        samples: dict[int, list[float]] = defaultdict(list)
        for _ in range(repeats):  # in rounds: a burst of load spreads over every size
            for k in SIZES:
                samples[k].append(timed(backend, probe[:k]))
        print(f"{depth:5} " + " ".join(f"{statistics.median(samples[k]) * 1e3:6.1f}" for k in SIZES))
    if threads is None:
        switching(backend, tokens, repeats * 4)
    backend.close()


def switching(backend: LlamaCppBackend, tokens: list[int], repeats: int) -> None:
    # llama.cpp reuses its compute graph while the block size stays the same.
    behind(backend, tokens, 256)
    probe = tokens[256:261]
    pairs = {"1 after 1": (1, 1), "1 after 5": (5, 1), "5 after 5": (5, 5), "5 after 1": (1, 5)}
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for name, (before, k) in pairs.items():
            timed(backend, probe[:before])
            samples[name].append(timed(backend, probe[:k]))
    print("a pass after a pass of another size (behind 256 tokens), ms:")
    print("  " + "  ".join(f"k={name}: {statistics.median(s) * 1e3:.2f}" for name, s in samples.items()))


def observed(model: str, runs: int) -> None:
    """Each verify pass of an n-gram run on the code edit against what the curve predicted."""
    runtime = load(model=model, strategy="ngram")
    policy = runtime.policy
    rows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    inner = policy.observe

    def observe(step: Step) -> None:
        predicted = policy.costs.verify(step.drafted + 1, step.depth)  # type: ignore[attr-defined]
        rows[step.drafted + 1].append((step.verify_seconds, predicted))
        inner(step)

    policy.observe = observe  # type: ignore[method-assign]
    prompt = next(p for p in SUITE if p.id == "code_edit")
    for _ in range(runs):
        runtime.generate(messages=prompt.messages, max_tokens=160, temperature=0)
    print(f"an n-gram run on code_edit ({runs} runs): measured pass vs the curve's prediction (with drift)")
    for k, pairs in sorted(rows.items()):
        real = statistics.mean(r for r, _ in pairs)
        predicted = statistics.mean(p for _, p in pairs)
        print(
            f"  k={k:<2} passes {len(pairs):3}  measured {real * 1e3:6.1f} ms  predicted {predicted * 1e3:6.1f} ms"
            f"  {real / predicted:5.2f}x"
        )
    runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    curves(args.model, args.repeats, None)
    curves(args.model, args.repeats, 1)
    observed(args.model, 3)


if __name__ == "__main__":
    main()
