"""The issue-2 yardstick: a bare greedy Python loop with n-gram drafting over the same
llama.cpp backend (the engine's lookup at a fixed draft length; no controller, statistics or
text assembly), measured side by side with the engine on the same prompt. Prints tokens/s of
both and their ratio.

    python benchmarks/bare_loop.py MODEL.gguf [--gamma 6] [--tokens 160] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from localspec.api import Runtime
from localspec.control.prompts import SUITE
from localspec.core.backend_loader import load_backend
from localspec.core.sampling import SamplingConfig
from localspec.core.templates import render_chat
from localspec.drafters.ngram import NgramDrafter


def bare_ngram_loop(backend, prompt: list[int], gamma: int, n_tokens: int) -> tuple[int, float]:
    backend.rollback(0)
    backend.eval_block(prompt[:-1], "none")
    ctx = list(prompt)
    eog = backend.end_of_generation()
    # The engine's own n-gram lookup, so both loops draft the same tokens and the ratio is
    # the engine's overhead alone.
    drafter = NgramDrafter()
    drafter.start(ctx)
    greedy, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    t0 = time.perf_counter()
    produced = 0
    while produced < n_tokens:
        draft = drafter.propose(ctx, gamma, greedy, rng).tokens
        past = backend.n_past
        picks = np.argmax(backend.eval_block([ctx[-1], *draft], "all"), axis=1)
        n = 0
        while n < len(draft) and draft[n] == picks[n]:
            n += 1
        backend.rollback(past + 1 + n)
        new = [*draft[:n], int(picks[n])]
        ctx.extend(new)
        produced += len(new)
        if any(t in eog for t in new):
            break
    return produced, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--gamma", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", default="code_edit")
    args = ap.parse_args()
    backend = load_backend("llamacpp", args.model)
    messages = next(p for p in SUITE if p.id == args.prompt).messages
    text = render_chat(backend.chat_template(), messages, backend.special_texts())
    prompt = backend.tokenize(text, add_special=False, parse_special=True)
    fixed = Runtime(backend, strategy="ngram", draft_tokens=args.gamma)
    auto = Runtime(backend, strategy="ngram")
    totals = {"bare loop": [0, 0.0], f"engine ngram γ={args.gamma}": [0, 0.0], "engine ngram auto": [0, 0.0]}
    for _ in range(args.repeats):
        n, s = bare_ngram_loop(backend, prompt, args.gamma, args.tokens)
        totals["bare loop"][0] += n
        totals["bare loop"][1] += s
        for name, rt in ((f"engine ngram γ={args.gamma}", fixed), ("engine ngram auto", auto)):
            backend.rollback(0)
            out = rt.generate(messages=messages, max_tokens=args.tokens, temperature=0)
            totals[name][0] += out.stats.generated_tokens
            totals[name][1] += out.stats.decode_seconds
    base = totals["bare loop"][0] / totals["bare loop"][1]
    for name, (n, s) in totals.items():
        print(f"{name:<22} {n / s:7.1f} tok/s  {n / s / base:5.2f}x of the bare loop  ({n} tokens)")


if __name__ == "__main__":
    main()
