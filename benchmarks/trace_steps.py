"""Per-step trace of the adaptive controller on one prompt of the bench suite: for each verify
step, the draft's support (n-gram match length), the draft length chosen and how many of its
tokens were accepted. Shows where a prompt gains and where it decodes one token per step.

    python benchmarks/trace_steps.py MODEL.gguf [--prompt code_edit] [--strategy ngram]
"""

from __future__ import annotations

import argparse

from localspec.api import load
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.prompts import SUITE
from localspec.core.stats import Step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompt", default="code_edit", choices=[p.id for p in SUITE])
    parser.add_argument("--strategy", default="ngram")
    parser.add_argument("--tokens", type=int, default=160)
    args = parser.parse_args()
    runtime = load(model=args.model, strategy=args.strategy)
    policy = runtime.policy
    if not isinstance(policy, AdaptiveDraftLength):
        raise SystemExit("the trace needs the adaptive draft length (--draft-tokens auto)")
    steps: list[tuple[int, int, int]] = []
    choose, choose_source, observe = policy.choose, policy.choose_source, policy.observe

    def traced_choose(limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        gamma = choose(limit, support, backlog, depth)
        steps.append((support, gamma, 0))
        return gamma

    def traced_choose_source(
        guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        # A draft model beside n-gram lookup: support 0 marks the model's drafts.
        gamma, from_lookup = choose_source(guessed, support, limit, backlog, depth)
        steps.append((support if from_lookup else 0, gamma, 0))
        return gamma, from_lookup

    def traced_observe(step: Step) -> None:
        support, gamma, _ = steps[-1]
        steps[-1] = (support, gamma, step.accepted)
        observe(step)

    policy.choose, policy.choose_source = traced_choose, traced_choose_source  # type: ignore[method-assign]
    policy.observe = traced_observe  # type: ignore[method-assign]
    prompt = next(p for p in SUITE if p.id == args.prompt)
    out = runtime.generate(messages=prompt.messages, max_tokens=args.tokens, temperature=0)
    print("support:drafted/accepted per step")
    print(" ".join(f"{s}:{g}/{a}" for s, g, a in steps))
    stats = out.stats
    print(f"{stats.generated_tokens} tokens in {len(steps)} steps; {stats.accepted} of {stats.drafted} drafts accepted")
    print(repr(out.text))


if __name__ == "__main__":
    main()
