"""A draft model alone, n-gram lookup alone, and the two side by side (the default for an
adaptive draft model), on the bench suite. Greedy answers are deterministic, so each
variant's verify passes are priced on the target's calibrated t_verify curve, with the
draft model's passes as timed: a comparison nearly free of the machine's noise. The
measured decode speedup, against plain runs before and after, is printed beside it.

    python benchmarks/hybrid_sources.py [MODEL.gguf] [--backend torch] [--strategy qspec:int8]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

from localspec.api import Runtime, load
from localspec.assembly import assemble
from localspec.control.calibrate import measure
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.prompts import SUITE
from localspec.core.stats import Step


def run(runtime: Runtime, messages: list[dict[str, str]], tokens: int) -> tuple[list[Step], float, int]:
    """The steps of one greedy answer, its decode seconds and its length."""
    policy = runtime.policy
    steps: list[Step] = []
    observe = policy.observe

    def recorded(step: Step) -> None:
        steps.append(step)
        observe(step)

    policy.observe = recorded  # type: ignore[method-assign]
    try:
        out = runtime.generate(messages=messages, max_tokens=tokens, temperature=0)
    finally:
        policy.observe = observe  # type: ignore[method-assign]
    return steps, out.stats.decode_seconds, out.stats.generated_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--strategy", default="qspec:int8", help="the draft model: draft (--draft-model), qspec...")
    parser.add_argument("--draft-model")
    parser.add_argument("--tokens", type=int, default=160)
    args = parser.parse_args()
    paired = load(model=args.model, backend=args.backend, strategy=args.strategy, draft_model=args.draft_model)
    lookup = load(model=args.model, backend=args.backend, strategy="ngram")
    plain = load(model=args.model, backend=args.backend, strategy="none")
    policy = paired.policy
    if not isinstance(policy, AdaptiveDraftLength) or paired.engine.lookup is None:
        raise SystemExit("needs the adaptive draft length with a draft model")
    # Priced on a curve measured now: the cached one may come from a busier or quieter hour.
    curve = measure(paired.target).cost_curve()
    print(f"t_verify(1, 2, 4, 8) now: {' '.join(f'{curve.measured(k) * 1e3:.1f}' for k in (1, 2, 4, 8))} ms")
    both = paired.engine.lookup
    draft_cost, catch_up = policy.draft_seconds_per_token, policy.catch_up_seconds_per_token
    print(f"draft model: {draft_cost * 1e3:.1f} ms a drafted token, {catch_up * 1e3:.1f} ms a caught-up token")
    print("| prompt | model alone | n-gram alone | side by side | measured: model | n-gram | side by side |")
    print("|---|---|---|---|---|---|---|")
    # Every answer starts from the policies as loaded: what one variant learned does not carry
    # into the next (a session's runtime keeps learning across requests).
    fresh = {id(runtime): copy.deepcopy(runtime.policy) for runtime in (paired, lookup)}
    for prompt in SUITE:
        priced, measured = [], []
        for base, side in ((paired, None), (lookup, None), (paired, both)):
            plan = dataclasses.replace(base.plan, lookup=side)
            runtime = Runtime(plan, assemble(plan, copy.deepcopy(fresh[id(base)])))
            before = run(plain, prompt.messages, args.tokens)
            steps, seconds, n = run(runtime, prompt.messages, args.tokens)
            after = run(plain, prompt.messages, args.tokens)
            depth = steps[0].depth
            # Verify passes at their calibrated cost; the draft model's own passes as timed
            # (its steps are short and steady; the load-time figure is an estimate of them).
            cost = sum(
                curve.measured(s.drafted + 1, s.depth) + (0.0 if base is lookup else s.draft_seconds) for s in steps
            )
            priced.append(sum(curve.measured(1, depth + i) for i in range(n)) / cost)
            measured.append((before[1] / before[2] + after[1] / after[2]) / 2 / (seconds / n))
        cells = [f"{x:.2f}x" for x in (*priced, *measured)]
        print(f"| {prompt.id} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
