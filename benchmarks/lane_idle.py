"""How much of the wall time the pool's pass thread spends running passes when N clients ask at
once, in process: the rest is the lanes' own host work between passes (their steps, the
handoffs), which llama-server spends in C++ (issue #57, "ahead of llama-server at every N").

    python benchmarks/lane_idle.py [--parallel 4] [--threads 2] [--rounds 4] [--strategy none]
        [--model GGUF] [--draft-model GGUF] [--draft-tokens N]

Each round sends --parallel fresh chat requests of 128 greedy tokens at once from as many
threads, and prints the wall time, the passes, the pass thread's busy share (LaneHost._run,
which holds the batch fill and the rows' read-back besides llama_decode) and the aggregate
tokens/s.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from localspec.backends.llamacpp import lanes
from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model
from localspec.pool import load_pool

PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Explain how a bicycle works, in detail.",
    "Describe the water cycle for a ten-year-old.",
    "Write a letter to a friend about a trip to the mountains.",
]
TOKENS = 128


class PassClock:
    """Seconds and count of LaneHost._run while installed."""

    def __init__(self) -> None:
        self.seconds, self.passes = 0.0, 0
        self._run = lanes.LaneHost._run

    def __enter__(self) -> PassClock:
        run = self._run

        def timed(host: lanes.LaneHost, asks: Any) -> None:
            t0 = time.perf_counter()
            run(host, asks)
            self.seconds += time.perf_counter() - t0
            self.passes += 1

        lanes.LaneHost._run = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        lanes.LaneHost._run = self._run  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--draft-model", default=None, help="the strategy's drafter file (an EAGLE-3 head, say)")
    parser.add_argument("--draft-tokens", default="auto", help="a fixed draft length (default: the controller's)")
    args = parser.parse_args()
    model = args.model or str(ensure_pypi_model())
    drafts: int | str = int(args.draft_tokens) if args.draft_tokens.isdigit() else args.draft_tokens
    options = {"strategy": args.strategy, "threads": args.threads, "memory": False, "draft_tokens": drafts}
    if args.draft_model:
        options["draft_model"] = args.draft_model
    pool = load_pool(model, parallel=args.parallel, **options)
    print(f"# lanes' pass thread: {host_kind()} host, {args.threads} thread(s), {time.strftime('%Y-%m-%d')}")
    print(f"\n{args.parallel} clients, strategy {args.strategy}, draft {args.draft_tokens}, {TOKENS} tokens each\n")
    print("| round | wall s | passes | pass thread busy | aggregate tok/s |\n|---|---|---|---|---|")

    def ask(i: int, r: int) -> None:
        text = f"Request {r}-{i}. {PROMPTS[i % len(PROMPTS)]}"
        answer = pool.generate(messages=[{"role": "user", "content": text}], max_tokens=TOKENS, temperature=0)
        kept[0] += answer.stats.accepted
        kept[1] += answer.stats.drafted
        kept[2] += len(answer.tokens)

    kept = [0, 0, 0]  # accepted, drafted, tokens: all rounds
    ask(0, -1)  # warm
    for r in range(args.rounds):
        with PassClock() as clock:
            threads = [threading.Thread(target=ask, args=(i, r)) for i in range(args.parallel)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
        rate = args.parallel * TOKENS / wall
        print(f"| {r + 1} | {wall:.2f} | {clock.passes} | {clock.seconds / wall:.1%} | {rate:.0f} |", flush=True)
    print(f"\naccepted {kept[0]} of {kept[1]} drafted; {kept[2]} tokens answered")
    merged = getattr(pool.runtimes[0].target, "host", None)
    heads = getattr(merged, "_merged", {})
    if heads:  # the heads' merged passes (head_passes.py), all rounds and the warm-up
        ran = sum(passes.figures.passes for passes in heads.values())
        print(f"\nheads' merged passes: {ran}, holding several lanes: {sum(p.figures.merged for p in heads.values())}")
    pool.close()


if __name__ == "__main__":
    main()
