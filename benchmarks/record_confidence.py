"""Records the target's own confidence along the recorded greedy answers (issue #58 item 5):
for every answer token, the top-1 probability and the top-1/top-2 margin of the target's row
that chose it (the row a step already holds when it decides the next draft: the one that
produced the pending token). Beside the answers, keyed like them:

    python benchmarks/record_confidence.py [--threads 1] [--out tests/data/answer_confidence.json]

Each answers file is decoded again as benchmarks/record_replay_answers.py recorded it: one
runtime per file, its prompts in order (a request reuses the prefix the one before cached), the
real SmolLM2-135M Q4_1, greedy, with the top two log-probabilities of every token. Where that
answer is not the recorded one (a near-tie another thread count tipped), the recorded answer's
rows are evaluated instead, prompt and answer in one-token passes; the file says which.
benchmarks/confidence_rules.py replays draft rules that read it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from localspec.api import Runtime, load
from localspec.control.prompts import load_prompt_sets
from localspec.core.protocol import eval_chunked
from localspec.models.default_model import ensure_pypi_model

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# Each answers file and the prompt sets it was recorded from, in the recording's order.
RECORDED = {
    "replay_answers.json": ["suite", str(ROOT / "benchmarks" / "prompts_wide.jsonl")],
    "heldout_answers.json": [str(ROOT / "benchmarks" / "prompts_heldout.jsonl")],
}


def rounded(p1: float, p2: float) -> tuple[float, float]:
    return round(p1, 4), round(p1 - p2, 4)


def decoded(runtime: Runtime, messages: Any, tokens: int) -> tuple[list[int], list[tuple[float, float]]]:
    """The greedy answer and (p1, margin) of every token, from the engine's own rows."""
    out = runtime.generate(messages=messages, max_tokens=tokens, temperature=0.0, logprobs=True, top_logprobs=2)
    rows = []
    for entry in out.logprobs or []:
        top = [math.exp(lp) for _, _, lp in entry.top] + [0.0, 0.0]
        rows.append(rounded(top[0], top[1]))
    return list(out.tokens), rows


def teacher_forced(runtime: Runtime, prompt: list[int], answer: list[int]) -> list[tuple[float, float]]:
    """(p1, margin) of the rows that chose the recorded answer, fed one token at a time."""
    target = runtime.target
    target.rollback(0)
    eval_chunked(target, prompt[:-1], "none", lambda: False)
    rows = []
    for i in range(len(answer)):
        logits = np.asarray(target.eval_block([prompt[-1] if i == 0 else answer[i - 1]], "all"))[0]
        probs = np.exp(logits.astype(np.float64) - logits.max())
        top2 = np.sort(np.partition(probs, -2)[-2:] / probs.sum())
        rows.append(rounded(float(top2[1]), float(top2[0])))
    return rows


def record_file(name: str, threads: int) -> dict[str, Any]:
    recorded = json.loads((DATA / name).read_text())
    runtime = load(model=str(ensure_pypi_model(quiet=True)), strategy="none", threads=threads)
    out: dict[str, Any] = {}
    try:
        for prompt in load_prompt_sets(RECORDED[name]):
            rec = recorded["answers"][prompt.id]
            tokens, rows = decoded(runtime, prompt.messages, recorded["tokens"])
            how = "decoded"
            if tokens != rec["answer"]:
                rows, how = teacher_forced(runtime, rec["prompt"], rec["answer"]), "teacher-forced"
            out[prompt.id] = {"p1": [r[0] for r in rows], "margin": [r[1] for r in rows], "rows": how}
            print(
                f"{name} {prompt.id}: {len(rows)} rows {how}, mean p1 {np.mean([r[0] for r in rows]):.3f}", flush=True
            )
    finally:
        runtime.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA / "answer_confidence.json")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    answers = {name: record_file(name, args.threads) for name in RECORDED}
    data = {
        "model": json.loads((DATA / "replay_answers.json").read_text())["model"],
        "rows": "p1[i], margin[i]: the top-1 probability and top-1 minus top-2 of the row that chose answer[i]",
        "answers": answers,
    }
    args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"-> {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
