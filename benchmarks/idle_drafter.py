"""Plain decoding with a draft model's llama.cpp context loaded in the process against
without it: what a second context costs the target when it is not even drafting (the bench
opens a drafter only for its own runs for this reason).

    python benchmarks/idle_drafter.py TARGET.gguf DRAFT.gguf [--prompt chat] [-r 5]

Runs alternate (alone, with the drafter loaded and idle, with it loaded after a draft run)
so that a machine that speeds up or slows down hits every column alike; prints the median
tokens/s of each and the ratios.
"""

from __future__ import annotations

import argparse
import statistics

from localspec.api import Runtime
from localspec.control.prompts import SUITE
from localspec.core.backend_loader import load_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("draft_model")
    parser.add_argument("--prompt", default="chat", choices=[p.id for p in SUITE])
    parser.add_argument("--repeats", "-r", type=int, default=5)
    parser.add_argument("--tokens", "-n", type=int, default=160)
    args = parser.parse_args()
    target = load_backend("llamacpp", args.model)
    plain = Runtime(target, strategy="none")
    messages = list(next(p for p in SUITE if p.id == args.prompt).messages)
    rates: dict[str, list[float]] = {"alone": [], "drafter loaded": [], "after a draft run": []}

    def rate() -> float:
        stats = plain.generate(messages=messages, max_tokens=args.tokens, temperature=0.0).stats
        return stats.decode_tokens_per_s

    rate()  # warm caches
    for _ in range(args.repeats):
        rates["alone"].append(rate())
        draft = load_backend("llamacpp", args.draft_model)
        try:
            rates["drafter loaded"].append(rate())
            Runtime(target, draft, strategy="draft").generate(messages=messages, max_tokens=32, temperature=0.0)
            rates["after a draft run"].append(rate())
        finally:
            draft.close()
    alone = statistics.median(rates["alone"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<18} {median:7.1f} tok/s  {median / alone:5.2f}x  (runs: {' '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
