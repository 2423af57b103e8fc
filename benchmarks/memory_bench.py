"""Requests that resemble earlier ones: n-gram lookup with the runtime's memory of earlier
requests, against lookup on the request's own text alone, plain decoding, and llama.cpp's
`llama-lookup` with and without its dynamic cache (`-lcd`, which it loads before a run and
saves after, so it too remembers earlier runs).

A session is a run of related requests (the same instruction on other records, the same
schema, the same kind of code) sent one after another, as an app or an agent sends them;
each session starts with an empty memory and an empty dynamic cache. The figures are over
every request but each session's first, which neither side can recall anything for.

    python benchmarks/memory_bench.py MODEL.gguf --peers-bin DIR [-n 160] [-r 1]
        [--sessions benchmarks/prompts_sessions.jsonl] [--only SESSION] [--gamma 4 --gamma 8]

localspec's three columns answer each request in turn, in an order rotated a place each
request and each repeat. Without --peers-bin only localspec's columns run. Tokens per target
pass are printed beside tokens/s: a busy host moves the latter, not the former.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from localspec.api import runtime_for
from localspec.common.templates import render_chat
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend
from localspec.drafters.memory import NgramMemory
from localspec.tooling.bench import geometric_mean
from localspec.tooling.peers import PeerRun, run_peer

SESSIONS = Path(__file__).with_name("prompts_sessions.jsonl")
OURS = ("plain", "ngram", "ngram+memory")


def load_sessions(path: Path) -> dict[str, list[str]]:
    sessions: dict[str, list[str]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            obj = json.loads(line)
            sessions[obj["session"]].append(obj["prompt"])
    return dict(sessions)


class Tally:
    def __init__(self) -> None:
        self.tokens: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps: dict[str, int] = defaultdict(int)  # target passes (ours): tokens a pass is load-free

    def add(self, column: str, tokens: int, seconds: float, steps: int = 0) -> None:
        self.tokens[column] += tokens
        self.seconds[column] += seconds
        self.steps[column] += steps

    def rate(self, column: str) -> float:
        return self.tokens[column] / self.seconds[column] if self.seconds[column] else 0.0


def run_session(
    target: Backend,
    model: str,
    prompts: list[str],
    args: argparse.Namespace,
    tally: Tally,
    counts: dict[str, int],
    rotation: int = 0,
) -> None:
    runtimes = {
        "plain": runtime_for(target, strategy="none"),
        "ngram": runtime_for(target, strategy="ngram"),
        "ngram+memory": runtime_for(target, strategy="ngram", memory=NgramMemory()),
    }
    template, specials = target.chat_template(), target.special_texts()
    with tempfile.TemporaryDirectory() as caches:
        for i, prompt in enumerate(prompts):
            messages = [{"role": "user", "content": prompt}]
            answers = {}
            # Interleaved, so drift hits every column alike, and rotated a place each request, so
            # no column always follows another on the same prompt (a fixed order could favour one).
            order = list(runtimes.items())
            shift = (i + rotation) % len(order)
            for column, runtime in order[shift:] + order[:shift]:
                out = runtime.generate(messages=messages, max_tokens=args.max_tokens, temperature=0.0)
                answers[column] = out.tokens
                if i > 0:
                    tally.add(column, out.stats.generated_tokens, out.stats.decode_seconds, out.stats.verify_steps)
            counts["requests"] += i > 0
            counts["identical"] += i > 0 and answers["ngram+memory"] == answers["plain"]
            text = render_chat(template, messages, specials)
            for gamma in args.gamma if args.peers_bin else []:
                for cached in (False, True):
                    cache = ["-lcd", str(Path(caches) / f"dynamic-{gamma}.bin")] if cached else []
                    lookup = PeerRun("llama-lookup", model, text, args.max_tokens, gamma, None, args.threads, cache)
                    peer = run_peer(args.peers_bin, lookup)
                    if i > 0:
                        tally.add(peer_column(gamma, cached), peer.tokens, peer.seconds)


def peer_column(gamma: int, cached: bool) -> str:
    return f"llama-lookup γ={gamma}" + (" -lcd" if cached else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--peers-bin", type=Path, help="folder with llama.cpp's llama-lookup")
    parser.add_argument("--only", action="append", help="run only this session (repeatable)")
    parser.add_argument("--sessions", type=Path, default=SESSIONS)
    parser.add_argument("--max-tokens", "-n", type=int, default=160)
    parser.add_argument("--repeats", "-r", type=int, default=1)
    parser.add_argument("--gamma", type=int, action="append", help="llama-lookup's draft length (default 4 and 8)")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    args.gamma = args.gamma or [4, 8]
    sessions = load_sessions(args.sessions)
    if args.only:
        sessions = {name: prompts for name, prompts in sessions.items() if name in args.only}
    target = load_backend("llamacpp", args.model, n_ctx=4096, **({"threads": args.threads} if args.threads else {}))
    runtime_for(target, strategy="none").generate("Hello", max_tokens=8, temperature=0.0)  # warm caches
    peers = [peer_column(g, c) for g in args.gamma for c in (False, True)] if args.peers_bin else []
    columns = [*OURS, *peers]
    per_session: dict[str, Tally] = {}
    counts = {"requests": 0, "identical": 0}
    for name, prompts in sessions.items():
        per_session[name] = tally = Tally()
        for repeat in range(args.repeats):
            run_session(target, args.model, prompts, args, tally, counts, rotation=repeat)
        print(name, {c: round(tally.rate(c), 1) for c in columns}, flush=True)
        passes = {c: round(tally.tokens[c] / tally.steps[c], 3) for c in columns if tally.steps[c]}
        print(name, "tokens per target pass", passes, flush=True)

    report(per_session, columns, peers)
    print(
        f"greedy answers with memory identical to plain decoding: {counts['identical']} of "
        f"{counts['requests']} requests; median plain "
        f"{statistics.median(t.rate('plain') for t in per_session.values()):.1f} tok/s"
    )


def report(per_session: dict[str, Tally], columns: list[str], peers: list[str]) -> None:
    """One Markdown table: tokens/s per column, then ngram+memory's ratio to each other column."""
    against = ["plain", "ngram", *peers]
    head = [f"{c} tok/s" for c in columns] + [f"memory vs {c}" for c in against]
    print(f"\n| session | {' | '.join(head)} |")
    print("|---" * (1 + len(head)) + "|")
    ratios: dict[str, list[float]] = defaultdict(list)
    for name, tally in per_session.items():
        for c in against:
            ratios[c].append(tally.rate("ngram+memory") / tally.rate(c))
        cells = [f"{tally.rate(c):.1f}" for c in columns] + [f"{ratios[c][-1]:.2f}x" for c in against]
        print(f"| {name} | {' | '.join(cells)} |")
    means = [""] * len(columns) + [f"**{geometric_mean(ratios[c]):.2f}x**" for c in against]
    print(f"| **geometric mean** | {' | '.join(means)} |\n")


if __name__ == "__main__":
    main()
