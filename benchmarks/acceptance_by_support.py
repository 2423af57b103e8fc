"""How often an n-gram guess is right, by support level, for greedy and for sampled answers.

The target decodes plainly (no draft is ever verified, so the answers are exactly the
target's), the n-gram drafter guesses before every step, and each guess is scored against
what the target then produced, token by token, as the controller's shadow evidence is: the
i-th token of a guess backed by s matched tokens counts at the level of s + i, given the
tokens before it came true. Under sampling a guessed token comes true with the target's
probability of it, which is what rejection sampling accepts it with, so the sampled rates
are the acceptance rates the controller should expect. The controller's priors
(`support_priors`, `sampled_support_priors` in localspec/control/config.py) are read from this.

    python benchmarks/acceptance_by_support.py MODEL.gguf [--prompts suite --prompts FILE] [--seeds 3] [-t 0.8]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence

from localspec.api import Runtime, load
from localspec.assembly import assemble
from localspec.control.config import DEFAULT
from localspec.control.policy import FixedDraftLength, support_level
from localspec.control.prompts import BenchPrompt, load_prompt_sets


class Tally(FixedDraftLength):
    """Plain decoding (γ = 0) that counts the shadow outcomes per support level."""

    def __init__(self) -> None:
        super().__init__(0)
        self.hits = [0] * len(DEFAULT.support_edges)
        self.seen = [0] * len(DEFAULT.support_edges)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        for i in range(start, min(accepted + 1, drafted)):
            level = support_level(support + i) - 1
            self.seen[level] += 1
            self.hits[level] += i < accepted


def levels() -> list[str]:
    names = [str(lo) if hi - 1 == lo else f"{lo}-{hi - 1}" for lo, hi in itertools.pairwise(DEFAULT.support_edges)]
    return [*names, f"{DEFAULT.support_edges[-1]}+"]


def measure(model: str, prompts: Sequence[BenchPrompt], tokens: int, temperature: float, seeds: int) -> Tally:
    loaded = load(model=model, strategy="ngram", draft_tokens=0)
    tally = Tally()
    runtime = Runtime(loaded.plan, assemble(loaded.plan, tally))  # its drafter, under the tally
    for prompt in prompts:
        for seed in range(seeds if temperature > 0 else 1):
            runtime.generate(messages=prompt.messages, max_tokens=tokens, temperature=temperature, seed=seed)
    loaded.close()
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument(
        "--prompts", action="append", help="'suite' or a JSONL file as `localspec bench --prompts` takes; repeatable"
    )
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--seeds", type=int, default=3, help="sampled answers per prompt")
    parser.add_argument("-t", "--temperature", type=float, default=0.8)
    args = parser.parse_args()
    prompts = load_prompt_sets(args.prompts or ["suite"])
    greedy = measure(args.model, prompts, args.tokens, 0.0, 1)
    sampled = measure(args.model, prompts, args.tokens, args.temperature, args.seeds)
    print(f"{'support':>8} {'greedy':>16} {f't={args.temperature:g}':>16}")
    for i, name in enumerate(levels()):
        cells = []
        for t in (greedy, sampled):
            rate = f"{t.hits[i] / t.seen[i]:.0%}" if t.seen[i] else "-"
            cells.append(f"{rate:>5} of {t.seen[i]:>6}")
        print(f"{name:>8} {cells[0]:>16} {cells[1]:>16}")


if __name__ == "__main__":
    main()
