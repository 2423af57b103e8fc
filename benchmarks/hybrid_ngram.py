"""n-gram lookup on a hybrid target (Qwen3.5-style Gated DeltaNet layers beside attention),
loaded as localspec loads it (no recurrent-state snapshots: a rejection is taken back from a
copy of the state, the replay priced) against the same lookup on a target that keeps
llama.cpp's four snapshots (what it loaded before), and against plain decoding, in process.

    python benchmarks/hybrid_ngram.py [--threads 2] [--rounds 4] [--tokens 160]

Two small random-weight hybrids (hybrid_costs.py's shapes, Q8_0): hybrid-87m, untied, whose
answers never repeat, so lookup has nothing to guess and drafting must cost nothing; and
hybrid-87m-loops, whose answers fall into loops that lookup copies. Each prompt is asked
greedy and seeded (temperature 1), the three ways in turn, rotating which goes first. Prints
each way's decode tokens/s (the median of its rounds), each lookup's ratio to plain decoding,
and what each lookup drafted and had accepted over its rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from hybrid_costs import model_file

from localspec.api import Runtime, runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.control.hardware import host_kind

PROMPTS = ["Once upon a time", "The cat sat on the mat. The cat sat on the", "1 2 3 4 5 6 7 8 9 10 11 12"]
WAYS = ("plain", "n-gram, 4 snapshots", "n-gram, copies")


def rate(runtime: Runtime, prompt: str, tokens: int, temperature: float) -> tuple[float, int, int]:
    """Decode tokens/s of one answer, and its drafted and accepted tokens."""
    answer = runtime.generate(prompt=prompt, max_tokens=tokens, temperature=temperature, seed=7, reuse_prefix="none")
    stats = answer.stats
    return stats.generated_tokens / stats.decode_seconds, stats.drafted, stats.accepted


def runtimes(path: Path, threads: int) -> tuple[list[Runtime], list[LlamaCppBackend]]:
    options = {"n_ctx": 2048, "threads": threads}
    plain = LlamaCppBackend(str(path), recurrent_snapshots=0, **options)
    snapshots = LlamaCppBackend(str(path), recurrent_snapshots=4, **options)
    copies = LlamaCppBackend(str(path), recurrent_snapshots=0, **options)
    ways = [
        runtime_for(plain, strategy="none"),
        runtime_for(snapshots, strategy="ngram"),
        runtime_for(copies, strategy="ngram"),
    ]
    return ways, [plain, snapshots, copies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--folder", default="/tmp/localspec-bench-hybrid", help="where the GGUFs are kept")
    args = parser.parse_args()
    print(f"# n-gram on a hybrid target: {host_kind()} host, {args.threads} thread(s), {time.strftime('%Y-%m-%d')}")
    for shape in ("hybrid-87m", "hybrid-87m-loops"):
        ways, targets = runtimes(model_file(shape, Path(args.folder), "Q8_0"), args.threads)
        print(f"\n## {shape} Q8_0\n")
        head = " | ".join(f"{w} tok/s" for w in WAYS)
        ratios = "4 snapshots / plain | copies / plain | drafted / accepted (4 snapshots; copies)"
        print(f"| prompt | sampling | {head} | {ratios} |")
        print("|---|---|" + "---|" * (len(WAYS) + 3))
        for prompt in PROMPTS:
            for temperature in (0.0, 1.0):
                for runtime in ways:
                    rate(runtime, prompt, 16, temperature)  # warm
                runs: list[list[tuple[float, int, int]]] = [[] for _ in WAYS]
                for r in range(args.rounds):
                    for k in [(r + i) % len(WAYS) for i in range(len(WAYS))]:
                        runs[k].append(rate(ways[k], prompt, args.tokens, temperature))
                median = [statistics.median(run[0] for run in way) for way in runs]
                cells = " | ".join(f"{m:.1f}" for m in median)
                ratios = f"{median[1] / median[0]:.3f}x | {median[2] / median[0]:.3f}x"
                drafts = "; ".join(f"{sum(r[1] for r in w)} / {sum(r[2] for r in w)}" for w in runs[1:])
                sampling = "greedy" if temperature == 0 else "seeded"
                print(f"| {prompt[:24]} | {sampling} | {cells} | {ratios} | {drafts} |", flush=True)
        for target in targets:
            target.close()


if __name__ == "__main__":
    main()
