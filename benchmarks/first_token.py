"""Time to the first token of plain decoding, with the prompt's last token folded into the
prompt's pass (what plain decoding does) and with that token in a pass of its own (what a
runtime that may draft does: n-gram lookup held at draft length 0), asked in turn on fresh
prompts of about 40 tokens, in process.

    python benchmarks/first_token.py [--threads 2] [--rounds 10] [--model GGUF]

Prints each way's median seconds to the first token and the median pair's ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import localspec
from localspec.api import Runtime, runtime_for
from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model

PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain how a bicycle works, in detail.",
    "Describe the water cycle for a ten-year-old.",
    "Write a letter to a friend about a trip to the mountains.",
]


def first_token_seconds(runtime: Runtime, text: str) -> float:
    t0 = time.perf_counter()
    messages = [{"role": "user", "content": text}]
    with runtime.stream(messages=messages, max_tokens=4, temperature=0, reuse_prefix="none") as events:
        for event in events:
            if getattr(event, "tokens", ()):
                return time.perf_counter() - t0
    raise SystemExit(f"no token came for {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    args = parser.parse_args()
    model = args.model or str(ensure_pypi_model())
    folded = localspec.load(model, strategy="none", threads=args.threads, memory=False)
    unfolded = runtime_for(folded.target, strategy="ngram", draft_tokens=0)
    ways = (folded, unfolded)
    for runtime in ways:
        first_token_seconds(runtime, "Say hello.")  # warm
    seconds: tuple[list[float], list[float]] = ([], [])
    for r in range(args.rounds):
        for i, prompt in enumerate(PROMPTS):
            for k in (0, 1) if (r + i) % 2 == 0 else (1, 0):
                seconds[k].append(first_token_seconds(ways[k], f"Request {r + 1}. {prompt}"))
    ratios = [f / u for f, u in zip(*seconds, strict=True)]
    day = time.strftime("%Y-%m-%d")
    print(f"# first token of plain decoding: {host_kind()} host, {args.threads} thread(s), {day}\n")
    print(f"- folded (the prompt's last token in its pass): {statistics.median(seconds[0]) * 1000:.1f} ms")
    print(f"- in a pass of its own: {statistics.median(seconds[1]) * 1000:.1f} ms")
    print(f"- folded / own pass: **{statistics.median(ratios):.3f}x** (median of {len(ratios)} pairs)")
    folded.close()


if __name__ == "__main__":
    main()
