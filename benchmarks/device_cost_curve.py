"""A GPU device's cost curve, every block size timed, against what the controller calibrates and
chooses from it: whether a 9-token pass is a cliff there (llama.cpp's Vulkan backend computes
blocks of up to 8 rows with its matrix-vector kernels, mul_mat_vec_max_cols = 8, and larger ones
with matrix-matrix kernels), and whether the draft lengths the controller picks on the
calibrated curve are the ones that pay on the measured one.

    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/device_cost_curve.py SMOLLM2.gguf [--max-k 17]

On Mesa's software device (lavapipe) this describes lavapipe, not any GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.control.calibrate import CALIBRATION_TEXT, SHALLOW_DEPTH, measure
from localspec.control.policy import decide_static

ACCEPTANCES = (0.5, 0.7, 0.8, 0.9, 0.95)


def every_size(backend: LlamaCppBackend, max_k: int, rounds: int) -> list[float]:
    """Median seconds of a pass over k tokens behind SHALLOW_DEPTH tokens, k = 1..max_k: the
    second of two equal passes (the first pays llama.cpp's graph rebuild), in rounds."""
    base = backend.tokenize(CALIBRATION_TEXT, add_special=True, parse_special=False) * 4
    backend.rollback(0)
    backend.eval_block(base[:SHALLOW_DEPTH], "none")
    probe = base[SHALLOW_DEPTH : SHALLOW_DEPTH + max_k]
    samples: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    for _ in range(rounds):
        for k in samples:
            for repeat in range(2):
                t0 = time.perf_counter()
                backend.eval_block(probe[:k], "all")
                if repeat:
                    samples[k].append(time.perf_counter() - t0)
                backend.rollback(SHALLOW_DEPTH)
    backend.rollback(0)
    return [statistics.median(samples[k]) for k in samples]


def best_gamma(curve: Sequence[float], alpha: float) -> tuple[int, float]:
    """The draft length with the most tokens a second for a free drafter at a constant
    acceptance alpha: (1 - alpha^(γ+1)) / (1 - alpha) tokens for a pass over γ+1."""
    rates = [((1 - alpha ** (g + 1)) / (1 - alpha)) / curve[g] for g in range(len(curve))]
    best = max(range(len(rates)), key=rates.__getitem__)
    return best, rates[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--max-k", type=int, default=17)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    # A short context: the calibration's second curve (behind 512 tokens) is left out.
    backend = LlamaCppBackend(args.model, n_ctx=128, gpu_layers=99, threads=args.threads)
    try:
        known = backend.capabilities.exactness
        print(f"{backend.info.name} on {backend.capabilities.extra.get('gpu', 'the CPU')}", flush=True)
        print(f"the load's check (device_check.py): blocks of up to {known.rows} tokens identical; {known.why}")
        measured = every_size(backend, args.max_k, args.rounds)
        calibrated = measure(backend, max_k=args.max_k, repeats=args.rounds).verify_seconds
    finally:
        backend.close()
    print("\n| k | every size timed, ms | t(k)/t(1) | the calibration's curve, ms |\n|---|---|---|---|")
    for k, (m, c) in enumerate(zip(measured, calibrated, strict=True), start=1):
        print(f"| {k} | {m * 1e3:.1f} | {m / measured[0]:.2f} | {c * 1e3:.1f} |")
    if args.max_k >= 9:
        print(f"\nt(9)/t(8) = {measured[8] / measured[7]:.2f}; t(8)/t(7) = {measured[7] / measured[6]:.2f}")
    print("\n| acceptance | controller's γ (calibrated curve) | best γ (every size timed) | controller's share |")
    print("|---|---|---|---|")
    for alpha in ACCEPTANCES:
        chosen = decide_static(calibrated, alpha, 0.0, args.max_k - 1).chosen
        best, rate = best_gamma(measured, alpha)
        mine = ((1 - alpha ** (chosen + 1)) / (1 - alpha)) / measured[chosen]
        print(f"| {alpha} | {chosen} | {best} | {mine / rate:.0%} |")


if __name__ == "__main__":
    main()
