"""Would a second n-gram candidate per step pay? Drafting several continuations where the
earlier occurrences disagree (a tree verified in one pass) only helps where the guess that
is drafted now misses its first token and another earlier continuation gets it right.
This counts that on real answers, choosing the best alternative after the fact (an upper
bound on what any rule for picking the second branch could get).

    python benchmarks/second_candidates.py MODEL.gguf [--prompts suite --prompts benchmarks/prompts_wide.jsonl]

Answers are plain greedy decoding of each prompt (160 tokens); at every position of an
answer the drafter guesses from the text so far, and each alternative is an earlier
occurrence of the last token followed by a different token than the guess's first.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from localspec.api import runtime_for
from localspec.control.prompts import load_prompt_sets
from localspec.core.backend_loader import load_backend
from localspec.core.engine import FREE_GUESS_TOKENS
from localspec.core.sampling import SamplingConfig
from localspec.drafters import common_prefix
from localspec.drafters.ngram import CANDIDATES, NgramDrafter

GREEDY = SamplingConfig(temperature=0.0)


def best_alternative(after: list[int], context: Sequence[int], guess: Sequence[int], truth: Sequence[int]) -> int:
    """How many tokens the best earlier continuation that starts unlike the guess gets right;
    after: the positions that follow earlier occurrences of the context's last token."""
    taken = {guess[0]} if guess else set()
    best = 0
    for pos in reversed(after[-CANDIDATES:]):
        if context[pos] in taken:
            continue
        taken.add(context[pos])
        best = max(best, common_prefix(context[pos : pos + FREE_GUESS_TOKENS], truth))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", action="append", help="'suite' or a JSONL file (default: suite and the wide set)")
    parser.add_argument("--max-tokens", "-n", type=int, default=160)
    args = parser.parse_args()
    runtime = runtime_for(load_backend("llamacpp", args.model, n_ctx=4096), strategy="none")
    positions = missed = rescued = guessed_right = alternative_right = 0
    for prompt in load_prompt_sets(args.prompts or ["suite", "benchmarks/prompts_wide.jsonl"]):
        context = runtime.prompt_tokens(messages=list(prompt.messages))
        answer = runtime.generate(messages=list(prompt.messages), max_tokens=args.max_tokens, temperature=0.0).tokens
        drafter = NgramDrafter()
        drafter.start(context)
        follows: dict[int, list[int]] = defaultdict(list)  # token -> positions right after it
        for end in range(1, len(context)):
            follows[context[end - 1]].append(end)
        for i in range(len(answer)):
            truth = answer[i : i + FREE_GUESS_TOKENS]
            guess = drafter.propose(context, FREE_GUESS_TOKENS, GREEDY, np.random.default_rng(0)).tokens
            right = common_prefix(guess, truth)
            positions += 1
            guessed_right += right
            if right == 0:
                missed += 1
                alternative = best_alternative(follows[context[-1]], context, guess, truth)
                rescued += alternative > 0
                alternative_right += alternative
            context.append(answer[i])
            follows[context[-2]].append(len(context) - 1)
    print(f"positions: {positions}; the guess misses its first token at {missed} ({missed / positions:.0%})")
    print(f"another earlier continuation gets it right at {rescued} ({rescued / positions:.1%} of positions)")
    print(
        f"tokens right from the guess, summed over positions: {guessed_right}; "
        f"added by the best alternative where the guess missed: {alternative_right} "
        f"(+{alternative_right / max(guessed_right, 1):.1%})"
    )


if __name__ == "__main__":
    main()
