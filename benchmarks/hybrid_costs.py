"""What a verify pass costs on a hybrid target (Qwen3.5's Gated DeltaNet layers beside
attention), what its MTP head costs, and what drafting would add: random weights at a real
Qwen3.5 shape, quantized with llama.cpp's own call, so speed only.

    python benchmarks/hybrid_costs.py                      # the 0.8B-class shape, Q4_K_M
    python benchmarks/hybrid_costs.py --peers-bin DIR      # also llama-bench's pass costs

One table of pass costs for blocks of k = 1..8 tokens, each a verify pass that keeps its
first token and takes the other k - 1 back:

- the decode alone (every row's logits, no snapshots, nothing taken back): the floor that
  llama.cpp itself needs for such a pass;
- through llama.cpp's per-token snapshots (n_rs_seq, localspec's default on qwen35: four of
  them, so a longer rejection takes the next path);
- through a copy of the recurrent state, restored, and the kept token replayed (what an
  architecture without snapshots gets);
- llama-bench's `-p k` (a prompt of k tokens from an empty cache) where its binary is given.

Then the MTP head's pass against a target step, what the snapshots cost a plain step, and
the speedups the costs allow at acceptance 0.6-0.9: the best fixed draft length against the
controller's choice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.copies import quantize
from localspec.control.hardware import physical_cores
from localspec.control.replay import projection_rows
from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf
from localspec.tooling.peers import bench_flags

# A Qwen3.5-0.8B-class layout: the family's head and state widths (its 27B's: head dim 256,
# recurrent state 128, an attention block every 4th) at 0.8B's width and depth, and its vocabulary.
SHAPES = {
    "qwen3.5-0.8b": HybridSpec(
        layers=24, interval=4, nextn=1, hidden=1024, heads=8, kv_heads=2, head_dim=256, ffn=3584,
        ssm_state=128, ssm_groups=16, ssm_heads=16, conv_kernel=4, vocab=248_320, half=True, n_ctx=4096,
    ),
    # Small enough to serve several streams on 2 cores, untied so its random answers do not
    # loop (n-gram would copy a loop): the concurrency benchmark's hybrid (concurrency.py --hybrid).
    "hybrid-87m": HybridSpec(
        layers=16, interval=4, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1536, ssm_state=64,
        ssm_groups=4, ssm_heads=8, vocab=32_000, half=True, tied=0.0, n_ctx=32_768,
    ),
    # The same with an MTP block (Qwen3.5's nextn layer), which `auto` drafts with: serving it
    # to several clients at once (concurrency.py --mtp).
    "hybrid-87m-mtp": HybridSpec(
        layers=16, interval=4, nextn=1, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1536, ssm_state=64,
        ssm_groups=4, ssm_heads=8, vocab=32_000, half=True, tied=0.0, n_ctx=32_768,
    ),
    # The same, its output head partly tied to the embedding: its answers fall into loops,
    # which n-gram lookup copies (hybrid_ngram.py).
    "hybrid-87m-loops": HybridSpec(
        layers=16, interval=4, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1536, ssm_state=64,
        ssm_groups=4, ssm_heads=8, vocab=32_000, half=True, tied=0.2, n_ctx=32_768,
    ),
}  # fmt: skip
MAX_K = 8
ALPHAS = (0.6, 0.7, 0.8, 0.9)
DEPTH = 256  # tokens of context behind every timed pass


def model_file(shape: str, folder: Path, ftype: str) -> Path:
    """The shape's GGUF in ftype, written and quantized once."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{shape}.{ftype}.gguf"
    if not final.exists():
        source = folder / f"{shape}.F16.gguf"
        if not source.exists():
            print(f"  writing {source.name} ...", file=sys.stderr, flush=True)
            write_qwen35_gguf(SHAPES[shape], source)
        print(f"  quantizing to {ftype} ...", file=sys.stderr, flush=True)
        quantize(source, final, ftype)
    return final


def pass_costs(model: LlamaCppBackend, reps: int, max_k: int = MAX_K) -> list[float]:
    """Seconds per verify pass of k = 1..max_k tokens that keeps one and takes k - 1 back."""
    rng = np.random.default_rng(0)
    model.rollback(0)
    model.eval_block(rng.integers(300, 5000, DEPTH).tolist(), "none")
    costs = []
    for k in range(1, max_k + 1):
        runs = []
        for _ in range(reps + 1):  # the first is a warm-up
            past = model.n_past
            block = rng.integers(300, 5000, k).tolist()
            t0 = time.perf_counter()
            model.eval_block(block, "all")
            model.rollback(past + 1)
            runs.append(time.perf_counter() - t0)
        costs.append(statistics.median(runs[1:]))
    return costs


def bare_costs(model: LlamaCppBackend, reps: int) -> list[float]:
    """Seconds per pass of k tokens with every row's logits and nothing taken back, on a
    context without snapshots: the work llama.cpp itself must do for a verify pass."""
    rng = np.random.default_rng(0)
    model.eval_block(rng.integers(300, 5000, DEPTH).tolist(), "none")
    costs = []
    for k in range(1, MAX_K + 1):
        runs = []
        for _ in range(reps + 1):
            block = rng.integers(300, 5000, k).tolist()
            t0 = time.perf_counter()
            model.eval_block(block, "all")
            runs.append(time.perf_counter() - t0)
        costs.append(statistics.median(runs[1:]))
    return costs


def step_cost(path: Path, snapshots: int, options: dict[str, int], reps: int) -> float:
    """Seconds per plain single-token step with llama.cpp keeping this many snapshots."""
    model = LlamaCppBackend(str(path), recurrent_snapshots=snapshots, **options)
    rng = np.random.default_rng(2)
    model.eval_block(rng.integers(300, 5000, DEPTH).tolist(), "none")
    runs = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        for token in rng.integers(300, 5000, 10).tolist():
            model.eval_block([token], "last")
        runs.append((time.perf_counter() - t0) / 10)
    model.close()
    return statistics.median(runs[1:])


def head_cost(model: LlamaCppBackend, reps: int) -> float:
    """Seconds per drafted token of the model's MTP head (one pass each, as it drafts)."""
    head = model.mtp_head()
    rng = np.random.default_rng(1)
    context = rng.integers(300, 5000, DEPTH).tolist()
    model.eval_block(context, "none")
    head.eval_block(context, "last")
    runs = []
    for _ in range(reps + 1):
        past = head.n_past
        t0 = time.perf_counter()
        for token in rng.integers(300, 5000, 3).tolist():
            head.eval_block([token], "last")
        runs.append((time.perf_counter() - t0) / 3)
        head.rollback(past)
    head.close()
    return statistics.median(runs[1:])


def llama_bench(bin_dir: Path, path: Path, threads: int) -> list[float] | None:
    """llama.cpp's own seconds for a pass over k tokens (llama-bench -p k), or None."""
    program = bin_dir / "llama-bench"
    if not program.exists():
        return None
    sizes = ",".join(str(k) for k in range(1, MAX_K + 1))
    cmd = [str(program), "-m", str(path), "-p", sizes, "-n", "0", "-t", str(threads), "-r", "5", "-o", "json"]
    cmd += bench_flags(str(path))  # on an AMX VM llama-bench's default repacking faults (llama.cpp#20824)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    by_k = {int(row["n_prompt"]): row["avg_ns"] / 1e9 for row in json.loads(out)}
    return [by_k[k] for k in range(1, MAX_K + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.5-0.8b")
    parser.add_argument("--ftype", default="Q4_K_M")
    parser.add_argument("--folder", default="/tmp/localspec-hybrid-bench", help="where the GGUFs are kept")
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--peers-bin", help="folder with llama.cpp's llama-bench (localspec bench --build-peers)")
    args = parser.parse_args()
    path = model_file(args.shape, Path(args.folder), args.ftype)
    options = {"n_ctx": 1024, "threads": args.threads}
    snapshots = LlamaCppBackend(str(path), **options)
    print(f"# {args.shape} {args.ftype} ({snapshots.info.size_bytes / 2**30:.2f} GiB), {args.threads} threads")
    curve = pass_costs(snapshots, args.reps)
    # A shape without a nextn layer has no head to time, and so no draft to project.
    mtp = head_cost(snapshots, args.reps) if SHAPES[args.shape].nextn else None
    snapshots.close()
    bare = LlamaCppBackend(str(path), recurrent_snapshots=0, **options)
    floor = bare_costs(bare, args.reps)
    bare.close()
    copies = LlamaCppBackend(str(path), recurrent_snapshots=0, **options)
    copied = pass_costs(copies, args.reps)
    copies.close()
    peer = llama_bench(Path(args.peers_bin), path, args.threads) if args.peers_bin else None

    head = f"{'k':>3}{'decode only ms':>16}{'snapshots ms':>14}{'vs decode':>11}{'t(k)/t(1)':>11}"
    head += f"{'copies ms':>11}{'t(k)/t(1)':>11}"
    print(f"\n{head}" + (f"{'llama-bench ms':>16}{'ours/theirs':>13}" if peer else ""))
    for k in range(1, MAX_K + 1):
        line = f"{k:>3}{floor[k - 1] * 1e3:16.1f}{curve[k - 1] * 1e3:14.1f}{curve[k - 1] / floor[k - 1]:11.2f}"
        line += f"{curve[k - 1] / curve[0]:11.2f}"
        line += f"{copied[k - 1] * 1e3:11.1f}{copied[k - 1] / curve[0]:11.2f}"
        if peer:
            line += f"{peer[k - 1] * 1e3:16.1f}{curve[k - 1] / peer[k - 1]:13.2f}"
        print(line)
    steps = {n: step_cost(path, n, options, args.reps) for n in (0, 4, 16)}
    print("\nplain step with n snapshots kept: " + ", ".join(f"{n}: {t * 1e3:.1f} ms" for n, t in steps.items()))
    if mtp is None:
        print(f"{args.shape} has no MTP head: no draft length to project")
        return
    print(f"MTP head: {mtp * 1e3:.1f} ms a drafted token, {mtp / curve[0]:.2f} of a target step")
    print(f"\n{'alpha':>6}{'best γ':>8}{'speedup':>9}{'controller γ':>14}{'speedup':>9}{'of best':>9}")
    for alpha, best, best_speed, chosen, chosen_speed in projection_rows(curve, mtp, ALPHAS):
        print(
            f"{alpha:6.1f}{best:8d}{best_speed:8.2f}x{chosen:14d}{chosen_speed:8.2f}x{chosen_speed / best_speed:9.0%}"
        )


if __name__ == "__main__":
    main()
