"""Bit for bit: is greedy speculative output plain decoding's, token for token, on llama.cpp's
CPU kernels, and what do the exact kernels (`--exact`) cost?

    python benchmarks/exactness.py --exact-lib BUILD/bin [--models A.gguf B.gguf] [--tokens 400]

For each model and each way of running it, one fresh process (ggml reads its kernel switch
once) answers four prompts greedily with plain decoding and with n-gram speculation and
prints how many answers are identical, where the first one parts, and the speeds:

- default: the installed llama-cpp-python as it is (llamafile, repacked K-quants, tiled
  K-quant matmul, flash attention on);
- exact: `--exact` on a llama.cpp built with -DGGML_LLAMAFILE=OFF (LLAMA_CPP_LIB_PATH=
  --exact-lib), as docs/usage.md tells a user to build it.

`--models` defaults to the embedded SmolLM2-135M Q4_1 and its Q4_K_M and Q8_0 requantizations
(made once beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works, step by step.",
    "List ten facts about the planet Mars, one per line, with a short explanation for each.",
    "Write Python code for a function that merges two sorted lists, then explain it.",
]

_CHILD = """
import json, sys
from localspec.api import load
model, tokens, exact, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", json.loads(sys.argv[4])
out = {}
for strategy in ("none", "ngram"):
    with load(model, strategy=strategy, exact=exact, memory=False, n_ctx=4096) as rt:
        rt.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)  # warm
        runs = [rt.generate(messages=[{"role": "user", "content": p}], max_tokens=tokens, temperature=0)
                for p in prompts]
    out[strategy] = {
        "texts": [r.text for r in runs],
        "tok_s": sum(r.stats.generated_tokens for r in runs) / sum(r.stats.decode_seconds for r in runs),
        "prefill_tok_s": sum(r.stats.prefill_tokens for r in runs) / sum(r.stats.prefill_seconds for r in runs),
    }
print(json.dumps(out))
"""


def run(model: Path, tokens: int, exact_lib: Path | None) -> dict[str, dict[str, object]]:
    env = dict(os.environ)
    if exact_lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(exact_lib)
    args = [sys.executable, "-c", _CHILD, str(model), str(tokens), "1" if exact_lib else "0", json.dumps(PROMPTS)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{model.name}: {done.stderr[-1500:]}")
    result: dict[str, dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def first_difference(a: str, b: str) -> str:
    at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return f"char {at}"


def default_models() -> list[Path]:
    from localspec.backends.llamacpp.copies import derived
    from localspec.models.default_model import ensure_pypi_model

    base = ensure_pypi_model(quiet=True)
    folder = base.parent / "exactness"
    return [base, derived(base, "Q4_K_M", folder), derived(base, "Q8_0", folder)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exact-lib", type=Path, required=True, help="lib folder of a -DGGML_LLAMAFILE=OFF build")
    parser.add_argument("--models", type=Path, nargs="*")
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    models = args.models or default_models()
    print(f"# greedy, {len(PROMPTS)} prompts x {args.tokens} tokens at most; plain decoding vs n-gram speculation")
    print("| model | kernels | identical answers | first parting | prefill tok/s | plain tok/s | n-gram tok/s |")
    print("|---|---|---:|---|---:|---:|---:|")
    for model in models:
        for label, lib in (("default", None), ("exact", args.exact_lib)):
            r = run(model, args.tokens, lib)
            plain, spec = r["none"], r["ngram"]
            pairs = list(zip(plain["texts"], spec["texts"], strict=True))  # type: ignore[call-overload]
            same = sum(a == b for a, b in pairs)
            parts = ", ".join(first_difference(a, b) for a, b in pairs if a != b) or "none"
            print(
                f"| {model.name} | {label} | {same}/{len(pairs)} | {parts} | {plain['prefill_tok_s']:.0f} |"
                f" {plain['tok_s']:.1f} | {spec['tok_s']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
