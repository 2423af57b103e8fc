"""Time to the first token with the prompt's last token folded into the prompt's pass, and with
that token in a pass of its own, asked in turn on fresh prompts of about 40 tokens, in process:

- plain decoding (`-s none`), which folds;
- n-gram lookup, the default, which folds where its policy declines the first guess (a guess
  backed by the prompt alone: nearly always);
- n-gram lookup with the first token's own pass (its policy told the first guess would be
  drafted, at draft length 0): what every n-gram request did before.

    python benchmarks/first_token.py [--threads 2] [--rounds 10] [--model GGUF]

Prints each way's median seconds to the first token and the median pairs' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import localspec
from localspec.api import Runtime, runtime_for
from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model
from localspec.testing.policies import DraftsFirstGuess

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
    plain = localspec.load(model, strategy="none", threads=args.threads, memory=False)
    ways = (
        plain,
        runtime_for(plain.target, strategy="ngram"),
        runtime_for(plain.target, strategy="ngram", policy=DraftsFirstGuess(0)),
    )
    names = ("plain decoding (folds)", "n-gram (folds where it declines the first guess)", "n-gram, own pass")
    for runtime in ways:
        first_token_seconds(runtime, "Say hello.")  # warm
    seconds: list[list[float]] = [[] for _ in ways]
    for r in range(args.rounds):
        for i, prompt in enumerate(PROMPTS):
            for k in [(r + i + j) % len(ways) for j in range(len(ways))]:
                seconds[k].append(first_token_seconds(ways[k], f"Request {r + 1}. {prompt}"))
    day = time.strftime("%Y-%m-%d")
    print(f"# first token: {host_kind()} host, {args.threads} thread(s), {day}\n")
    for name, way in zip(names, seconds, strict=True):
        print(f"- {name}: {statistics.median(way) * 1000:.1f} ms")
    for a, b in ((1, 2), (0, 2), (1, 0)):
        ratios = [x / y for x, y in zip(seconds[a], seconds[b], strict=True)]
        print(f"- {names[a]} / {names[b]}: **{statistics.median(ratios):.3f}x** (median of {len(ratios)} pairs)")
    plain.close()


if __name__ == "__main__":
    main()
