"""A stored `localspec bench --peers` table's ratios against llama-lookup, recounted as the bench
counts a peer's rate since 2026-11-30 (localspec.tooling.peers.answer_tokens): llama-lookup
printed its answer's tokens plus the end of text's, so each answer that ended before the token
limit read one token faster a pass there than localspec's same answer.

    python benchmarks/recount_peers.py TABLE.md ANSWERS.json [--limit 160]

ANSWERS: the greedy answers the table's model gives (benchmarks/record_replay_answers.py),
whose lengths say which answers ended on an end of text. Prints the geometric means against
γ=4 and γ=8, as printed and recounted.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from localspec.tooling.bench import geometric_mean
from localspec.tooling.peers import answer_tokens

ROW = re.compile(
    r"(\S+)\s+ngram\s+[\d.]+\s+([\d.]+).*?llama-lookup \(γ=4\)\s+([\d.]+)\s+\S+\s+llama-lookup \(γ=8\)\s+([\d.]+)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("answers", type=Path)
    parser.add_argument("--limit", type=int, default=160, help="the table's -n")
    args = parser.parse_args()
    lengths = {k: len(v["answer"]) for k, v in json.loads(args.answers.read_text())["answers"].items()}
    rows = [m.groups() for line in args.table.read_text().splitlines() if (m := ROW.match(line))]
    for label, recount in (("as printed", False), ("recounted", True)):
        ratios: dict[int, list[float]] = {4: [], 8: []}
        for prompt, ours, four, eight in rows:
            # What the peer printed: the answer and its end of text, or one past the limit.
            printed = lengths[prompt] + 1
            scale = printed / answer_tokens(printed, args.limit) if recount else 1.0
            ratios[4].append(float(ours) / float(four) * scale)
            ratios[8].append(float(ours) / float(eight) * scale)
        print(
            f"{args.table.name} {label}: γ=4 {geometric_mean(ratios[4]):.3f}x, γ=8 {geometric_mean(ratios[8]):.3f}x "
            f"({len(rows)} prompts)"
        )


if __name__ == "__main__":
    main()
