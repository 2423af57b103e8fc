"""Prints the bench JSON files of a results folder as Markdown tables for the pages under benchmarks/pages/."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def spread(row: dict[str, float]) -> str:
    """The range of the per-repeat ratios behind a speedup, where the bench recorded it."""
    low, high = row.get("speedup_low", 0.0), row.get("speedup_high", 0.0)
    return f" ({low:.2f}–{high:.2f})" if high > low > 0 else ""


def table(path: Path) -> str:
    data = json.loads(path.read_text())
    rows = data["results"]
    peers = any(r.get("peer_program") for r in rows)
    lookup = any(r.get("lookup_share") for r in rows)  # a draft model drafting beside n-gram lookup
    head = "| prompt | strategy | plain tok/s | spec tok/s | speedup | accepted | tok/step | mean γ |"
    sep = "|---|---|---|---|---|---|---|---|"
    if lookup:
        head += " drafted by lookup |"
        sep += "---|"
    if peers:
        head += " llama.cpp program | its tok/s | localspec vs it |"
        sep += "---|---|---|"
    lines = [f"`{path.name}`: {json.dumps(data['config'])}", "", head, sep]
    for r in rows:
        line = (
            f"| {r['prompt']} | {r['strategy']} | {r['plain_tokens_per_s']:.1f} | {r['spec_tokens_per_s']:.1f} | "
            f"**{r['speedup']:.2f}x**{spread(r)} | {r['acceptance_rate']:.0%} | {r['tokens_per_step']:.2f} | "
            f"{r['mean_gamma']:.2f} |"
        )
        if lookup:
            share = r.get("lookup_share", 0.0)
            line += f" {share:.0%} |" if share else " – |"
        if peers:
            line += (
                f" {r.get('peer_program', '')} | {r.get('peer_tokens_per_s', 0):.1f} | {r.get('vs_peer', 0):.2f}x |"
                if r.get("peer_program")
                else " | | |"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="`localspec bench --json` outputs")
    args = parser.parse_args(argv)
    for path in args.runs:
        try:
            print(table(path))
        except (OSError, ValueError, KeyError) as exc:
            print(f"summarize: {path}: not a `localspec bench --json` output ({exc})", file=sys.stderr)
            return 2
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
