"""What a DFlash drafter costs beside a hybrid target on llama.cpp, pass for pass against
llama.cpp's own draft-dflash: random weights at a real Qwen3.5 shape, quantized with
llama.cpp's own call, so speed only (random weights agree with nothing).

    python benchmarks/dflash_shapes.py --peers-bin DIR   # DIR: llama.cpp's programs

The target is hybrid_costs.py's Qwen3.5-0.8B-class hybrid (24 blocks, the family's head and
state widths, its 248,320-token vocabulary). The drafter is a z-lab-style DFlash model at its
width: 5 blocks reading 5 of the target's layers, sharing the target's embeddings and head
(so its block pass pays the 248k-row head for every position), trained block 16.

- t(k): a verify pass over k = 1..16 tokens that keeps one and takes the rest back (through
  the snapshots up to 4 rejected, the state copy and a replay beyond);
- the drafter's block pass and its injection of the target's features, against a target step;
- the projected speedup at acceptances 0.5-0.9 (the block priced as one pass, a replay past
  the snapshots priced in), best fixed length against the controller's choice;
- end to end, 64 greedy tokens at a fixed block of 15: localspec's steps against
  `llama-speculative-simple --spec-type draft-dflash`, and localspec's controller.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hybrid_costs import DEPTH, model_file, pass_costs

from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.copies import quantize
from localspec.control.costs import CostCurve
from localspec.control.hardware import physical_cores
from localspec.control.policy import AdaptiveDraftLength
from localspec.testing.dflash_support import DFlashShape, write_dflash_file

SHAPE = "qwen3.5-0.8b"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 1024, 8, 2, 128, 3584
DRAFT_LAYERS = 5
TARGET_LAYERS = (2, 7, 13, 18, 23)  # llama.cpp's ids (z-lab's + 1): spread over the 24 blocks
BLOCK = 16
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
PROMPT = "the world and the world and the"


def write_drafter(target: Path, path: Path) -> Path:
    import gguf

    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, shape[-1] ** -0.5, shape).astype(np.float16)

    ones = np.ones(HIDDEN, dtype=np.float32)
    tensors: dict[str, np.ndarray] = {
        "fc.weight": w(HIDDEN, HIDDEN * len(TARGET_LAYERS)),
        "enc.output_norm.weight": ones,
        "output_norm.weight": ones,
    }
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(DRAFT_LAYERS):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": ones,
            p + "attn_q.weight": w(q, HIDDEN),
            p + "attn_k.weight": w(kv, HIDDEN),
            p + "attn_v.weight": w(kv, HIDDEN),
            p + "attn_output.weight": w(HIDDEN, q),
            p + "attn_q_norm.weight": np.ones(HEAD_DIM, dtype=np.float32),
            p + "attn_k_norm.weight": np.ones(HEAD_DIM, dtype=np.float32),
            p + "ffn_norm.weight": ones,
            p + "ffn_gate.weight": w(FFN, HIDDEN),
            p + "ffn_up.weight": w(FFN, HIDDEN),
            p + "ffn_down.weight": w(HIDDEN, FFN),
        }
    shape = DFlashShape(DRAFT_LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, BLOCK, TARGET_LAYERS, 10_000_000.0)
    return write_dflash_file(gguf.GGUFReader(str(target)), path, shape, tensors, mask_id=248_000)


def drafter_file(target_f16: Path, folder: Path, ftype: str) -> Path:
    final = folder / f"{SHAPE}-dflash.{ftype}.gguf"
    if not final.exists():
        source = write_drafter(target_f16, folder / f"{SHAPE}-dflash.F16.gguf")
        quantize(source, final, ftype)
    return final


def drafter_costs(
    model: LlamaCppBackend, drafter: Any, reps: int, clock: Callable[[], float] = time.perf_counter, depth: int = DEPTH
) -> tuple[float, float, float]:
    """The block pass, injecting one position, injecting a block of 16 (seconds on `clock`,
    medians), behind `depth` tokens of context."""
    from localspec.core.sampling import SamplingConfig

    rng = np.random.default_rng(1)
    context = rng.integers(300, 5000, depth).tolist()
    model.rollback(0)
    model.eval_block(context[:-1], "none")
    drafter.start(context)
    greedy, gen = SamplingConfig(temperature=0), np.random.default_rng(0)
    passes, one, block = [], [], []
    for _ in range(reps + 1):
        t0 = clock()
        drafter.propose(context, BLOCK - 1, greedy, gen)
        passes.append(clock() - t0)
    for _ in range(reps + 1):
        for size, runs in ((1, one), (16, block)):
            past = model.n_past
            tokens = rng.integers(300, 5000, size).tolist()
            model.eval_block(tokens, "none")
            t0 = clock()
            drafter._inject(model.n_past)
            runs.append(clock() - t0)
            drafter._rollback(past)
            model.rollback(past)
    return statistics.median(passes[1:]), statistics.median(one[1:]), statistics.median(block[1:])


def projection(curve: list[float], pass_seconds: float, beyond: int) -> list[str]:
    rows = []
    for alpha in ALPHAS:
        policy = AdaptiveDraftLength(
            CostCurve(list(curve)), 0.0, max_gamma=BLOCK - 1, prior=alpha, prior_weight=1e9,
            draft_seconds_per_pass=pass_seconds, replays_beyond=beyond, replay_overhead=0.0,
        )  # fmt: skip
        rates = {g: policy.rate(g) for g in range(BLOCK)}
        best = max(rates, key=rates.__getitem__)
        chosen = policy.choose(BLOCK - 1)
        plain = rates[0]
        rows.append(
            f"{alpha:6.1f}{best:8d}{rates[best] / plain:8.2f}x{chosen:14d}{rates[chosen] / plain:8.2f}x"
            f"{rates[chosen] / rates[best]:9.0%}"
        )
    return rows


def ours(target: Path, drafter: Path, options: dict[str, Any], gamma: int | str) -> tuple[float, int, int, int]:
    """tok/s, verify steps, drafted, accepted over 64 greedy tokens."""
    model = LlamaCppBackend(str(target), **options)
    block = model.dflash_drafter(str(drafter))
    runtime = runtime_for(model, strategy="dflash", block=block, draft_tokens=gamma, calibrate=gamma == "auto")
    runtime.generate(prompt=PROMPT, max_tokens=8, temperature=0)  # warm-up
    stats = runtime.generate(prompt=PROMPT + " again", max_tokens=64, temperature=0).stats
    runtime.close()
    return stats.generated_tokens / stats.decode_seconds, stats.verify_steps, stats.drafted, stats.accepted


def theirs(bin_dir: Path, target: Path, drafter: Path, threads: int) -> str:
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter)]
    cmd += ["--spec-type", "draft-dflash", "--spec-draft-n-max", str(BLOCK - 1), "--spec-draft-p-min", "0"]
    cmd += ["-p", PROMPT + " again", "-n", "64", "--temp", "0", "-t", str(threads), "-c", "1024"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    drafted = re.search(r"n_drafted = (\d+)", text)
    accepted = re.search(r"n_accept  = (\d+)", text)
    if not (decoded and drafted and accepted):
        return "llama-speculative-simple gave no summary:\n" + text[-2000:]
    n, seconds = int(decoded.group(1)), float(decoded.group(2))
    return f"{n / seconds:.1f} tok/s, {drafted.group(1)} drafted / {accepted.group(1)} accepted ({n} tokens)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ftype", default="Q4_K_M")
    parser.add_argument("--folder", default="/tmp/localspec-hybrid-bench", help="where the GGUFs are kept")
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--peers-bin", help="folder with llama.cpp's llama-speculative-simple")
    args = parser.parse_args()
    folder = Path(args.folder)
    target = model_file(SHAPE, folder, args.ftype)
    drafter = drafter_file(folder / f"{SHAPE}.F16.gguf", folder, args.ftype)
    options = {"n_ctx": 1024, "threads": args.threads}
    model = LlamaCppBackend(str(target), **options)
    block = model.dflash_drafter(str(drafter))
    print(f"# {SHAPE} {args.ftype} target ({model.info.size_bytes / 2**20:.0f} MiB), DFlash drafter "
          f"{DRAFT_LAYERS} blocks ({block.size_bytes / 2**20:.0f} MiB), {args.threads} threads")  # fmt: skip
    curve = pass_costs(model, args.reps, max_k=BLOCK)
    block_pass, inject_one, inject_block = drafter_costs(model, block, args.reps)
    beyond = model.capabilities.replays_beyond
    model.close()
    print(f"\n{'k':>3}{'t(k) ms':>10}{'t(k)/t(1)':>11}")
    for k, t in enumerate(curve, 1):
        print(f"{k:>3}{t * 1e3:10.1f}{t / curve[0]:11.2f}")
    steps = block_pass / curve[0]
    print(f"\nDFlash block pass ({BLOCK} positions): {block_pass * 1e3:.1f} ms = {steps:.2f} target steps")
    print(f"injecting the target's features: {inject_one * 1e3:.2f} ms for 1 position, {inject_block * 1e3:.2f} for 16")
    print(f"\n{'alpha':>6}{'best γ':>8}{'speedup':>9}{'controller γ':>14}{'speedup':>9}{'of best':>9}")
    for row in projection(curve, block_pass, beyond if beyond is not None else 0):
        print(row)
    print("\n64 greedy tokens (random weights: nothing is accepted)")
    for gamma in (15, "auto"):
        rate, steps, drafted, accepted = ours(target, drafter, options, gamma)
        print(f"localspec --strategy dflash --draft-tokens {gamma}: {rate:.1f} tok/s, {steps} steps, "
              f"{drafted} drafted / {accepted} accepted")  # fmt: skip
    plain = runtime_for(LlamaCppBackend(str(target), **options), strategy="none")
    plain.generate(prompt=PROMPT, max_tokens=8, temperature=0)
    stats = plain.generate(prompt=PROMPT + " again", max_tokens=64, temperature=0).stats
    plain.close()
    print(f"localspec --strategy none: {stats.generated_tokens / stats.decode_seconds:.1f} tok/s")
    if args.peers_bin:
        peer = theirs(Path(args.peers_bin), target, drafter, args.threads)
        print("llama-speculative-simple --spec-type draft-dflash -n 64: " + peer)


if __name__ == "__main__":
    main()
