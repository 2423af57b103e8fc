"""The switches that can be flipped per model or per pass, priced A/B pass by pass in one
process: on a shared host the load drifts between two processes, but hardly between two
passes a few milliseconds apart (issue #45; exact_costs.py prices the per-process switches).

    python benchmarks/exact_paired.py --model M.gguf [--pairs 40] [--threads 2]

- repack: the model loaded twice, with and without repacked weights; a one-token pass, a
  block of 5 and a 128-token prefill alternate between the two;
- split: a block of 9 and of 17 verified whole or in pieces of 7 (localspec's default on
  K-quant files), on the unrepacked model;
- flash attention: two contexts, on and off, one-token passes and blocks of 5 behind 320
  tokens (past 256, where a one-token pass splits with flash attention on).

Each figure is the median over pairs of B's time over A's, in wall time (the pair's passes
run back to back) with the interquartile range of the ratios, and the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

DEPTH = 320
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He carried a small tin of oil, "
    "a cloth, and a notebook in which he wrote down the weather and the ships he had seen. "
) * 40


def backend(path: str, threads: int, repack: bool, flash: str) -> Any:
    os.environ["LLAMA_ARG_FLASH_ATTN"] = flash
    import localspec.backends.llamacpp.backend as module
    from localspec.backends.llamacpp.kernels import KernelPlan
    from localspec.core.protocol import UNKNOWN

    module.kernels_for = lambda *a, **k: KernelPlan(repack, None, UNKNOWN)  # type: ignore[assignment]
    return module.LlamaCppBackend(path, n_ctx=1024, threads=threads)


def paired(a: Callable[[], None], b: Callable[[], None], pairs: int) -> str:
    ratios = []
    for i in range(pairs):
        first, second = (a, b) if i % 2 == 0 else (b, a)  # alternate which goes first
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        t2 = time.perf_counter()
        ta, tb = (t1 - t0, t2 - t1) if i % 2 == 0 else (t2 - t1, t1 - t0)
        ratios.append(tb / ta)
    q = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f} (IQR {q[0]:.3f}–{q[2]:.3f}), load {os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="+", default=["repack", "split", "flash"])
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    packed = backend(args.model, args.threads, True, "auto")
    plain = backend(args.model, args.threads, False, "auto")
    ids = plain.tokenize(TEXT, add_special=False, parse_special=False)[: DEPTH + 20]
    for b in (packed, plain):
        b.eval_block(ids[:DEPTH], "none")

    def block(b: Any, k: int, pieces: int | None = None) -> Callable[[], None]:
        def run() -> None:
            step = pieces or k
            for i in range(0, k, step):
                b.eval_block(ids[DEPTH + i : DEPTH + min(k, i + step)], "all")
            b.rollback(DEPTH)

        return run

    def prefill(b: Any) -> Callable[[], None]:
        def run() -> None:
            b.rollback(0)
            b.eval_block(ids[:128], "last")

        return run

    print(f"{os.path.basename(args.model)}, {args.threads} threads: time with the switch / without, per pass")
    if "repack" in args.only:
        for k in (1, 5):
            print(f"unrepacked / repacked, block of {k}: {paired(block(packed, k), block(plain, k), args.pairs)}")
        print(f"unrepacked / repacked, prefill 128: {paired(prefill(packed), prefill(plain), args.pairs // 4)}")
        for b in (packed, plain):
            b.rollback(0)
            b.eval_block(ids[:DEPTH], "none")
    if "split" in args.only:
        for k in (9, 17):
            print(f"in pieces of 7 / whole, block of {k}: {paired(block(plain, k), block(plain, k, 7), args.pairs)}")
    if "flash" in args.only:
        packed.close()
        flash_off = backend(args.model, args.threads, False, "off")
        flash_off.eval_block(ids[:DEPTH], "none")
        for k in (1, 5):
            print(f"flash attention off / on, block of {k}: {paired(block(plain, k), block(flash_off, k), args.pairs)}")


if __name__ == "__main__":
    main()
