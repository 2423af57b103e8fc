"""Time to first token with a self-drafter at a fixed draft length, where the drafter must
take in the whole prompt too: the prefill of target and drafter, then a short answer.

    python benchmarks/drafter_prefill.py MODEL.gguf [--backend torch] [--strategy qspec:int4]
"""

from __future__ import annotations

import argparse

from localspec.api import load
from localspec.control.prompts import SUITE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--strategy", default="qspec:int4")
    parser.add_argument("--prompt", default="code_edit", choices=[p.id for p in SUITE])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    # A fixed draft length: the drafter drafts from the first token, so its prefill is paid.
    runtime = load(model=args.model, backend=args.backend, strategy=args.strategy, draft_tokens=3)
    prompt = next(p for p in SUITE if p.id == args.prompt)
    out = runtime.generate(messages=list(prompt.messages), max_tokens=args.tokens, temperature=0.0)
    s = out.stats
    print(
        f"{args.backend} {args.strategy} {args.prompt}: {s.prompt_tokens}-token prompt, prefill "
        f"{s.prefill_seconds:.2f} s; then {s.generated_tokens} tokens at {s.decode_tokens_per_s:.1f} tok/s "
        f"({s.accepted}/{s.drafted} drafted tokens accepted)"
    )


if __name__ == "__main__":
    main()
