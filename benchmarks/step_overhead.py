"""What the engine spends per step outside the target's pass, for plain decoding, n-gram
lookup and a draft model beside lookup, on one prompt: the controller's and drafters' share
of a step. On a prompt where nothing is drafted (the default's *chat* answer) the three do
the same passes, so the difference is the price of deciding not to draft.

    python benchmarks/step_overhead.py TARGET.gguf DRAFT.gguf [--prompt chat] [-r 5]
"""

from __future__ import annotations

import argparse
import statistics

from localspec.api import Runtime
from localspec.backend_loader import load_backend
from localspec.prompts import SUITE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("draft_model")
    parser.add_argument("--prompt", default="chat", choices=[p.id for p in SUITE])
    parser.add_argument("--repeats", "-r", type=int, default=5)
    args = parser.parse_args()
    target, draft = load_backend("llamacpp", args.model), load_backend("llamacpp", args.draft_model)
    runtimes = {
        "none": Runtime(target, strategy="none"),
        "ngram": Runtime(target, strategy="ngram"),
        "draft": Runtime(target, draft, strategy="draft"),
    }
    prompt = next(p for p in SUITE if p.id == args.prompt)
    outside: dict[str, list[float]] = {name: [] for name in runtimes}
    passes: dict[str, list[float]] = {name: [] for name in runtimes}
    drafted = dict.fromkeys(runtimes, 0)
    for _ in range(args.repeats):
        for name, runtime in runtimes.items():  # interleaved, as the bench does
            s = runtime.generate(messages=list(prompt.messages), max_tokens=160, temperature=0.0).stats
            outside[name].append((s.decode_seconds - s.verify_seconds) / s.verify_steps * 1e3)
            passes[name].append(s.verify_seconds / s.verify_steps * 1e3)
            drafted[name] += s.drafted
    for name in runtimes:
        print(
            f"{name:<6} outside the pass {statistics.median(outside[name]):.3f} ms/step, "
            f"pass {statistics.median(passes[name]):.2f} ms/step, {drafted[name]} tokens drafted"
        )


if __name__ == "__main__":
    main()
