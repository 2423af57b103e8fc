"""What each of llama.cpp's batch-variant CPU kernels buys, priced one switch at a time
(issue #45): prefill, a one-token pass (plain decoding) and verify blocks of 5, 9 and 17 rows
(speculation at γ = 4, 8, 16), each with the switch on and off.

    python benchmarks/exact_costs.py --models A.gguf B.gguf [--nolf-lib BUILD/bin] [--rounds 5]

Switches (each a fresh process: ggml reads its own switches once):
- llama.cpp: llama.cpp's own kernel choice on the installed llama-cpp-python (repacked
  weights, whole verify blocks), as localspec ran before issue #45: every ratio is against it;
- no-repack: weights in their file layout (LLAMA_ARG_REPACK=0);
- no-repack+no-tiled: and ggml's tiled K-quant matmul off (GGML_CPU_TILED_MM=0);
- localspec: localspec's default (backends/llamacpp/kernels.py: no repacking of K-quants,
  verify blocks of 8+ rows in pieces of 7);
- localspec+fa-off: and flash attention off (LLAMA_ARG_FLASH_ATTN=off: no split-KV path);
- no-llamafile(+fa-off): localspec's default on llama.cpp built with -DGGML_LLAMAFILE=OFF
  (--nolf-lib, through LLAMA_CPP_LIB_PATH);
- exact: `exact=True` on that build.

Rounds interleave the switches so load drifts touch them all alike; each figure is the median
over rounds of a process's median over repeats, in process CPU time (OpenMP waits passively,
so CPU time is work done, not spinning) and in wall time, with the 1-minute load beside it.
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

PREFILL = 256  # prompt tokens in one block
DEPTH = 320  # context a verify block runs behind: past 256 cells, where flash attention splits one query
BLOCKS = (1, 5, 9, 17)
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He carried a small tin of oil, "
    "a cloth, and a notebook in which he wrote down the weather and the ships he had seen. "
) * 40

# Each switch: environment for a fresh process, plus "PLAN": "llama.cpp" for llama.cpp's own
# choice of kernels (repacked weights, whole verify blocks: localspec before issue #45),
# "EXACT" for exact=True; "LIB" runs the -DGGML_LLAMAFILE=OFF build.
SWITCHES: dict[str, dict[str, str]] = {
    "llama.cpp": {"PLAN": "llama.cpp"},
    "no-repack": {"PLAN": "llama.cpp", "LLAMA_ARG_REPACK": "0"},
    "no-repack+no-tiled": {"PLAN": "llama.cpp", "LLAMA_ARG_REPACK": "0", "GGML_CPU_TILED_MM": "0"},
    "localspec": {},
    "localspec+fa-off": {"LLAMA_ARG_FLASH_ATTN": "off"},
    "no-llamafile": {"LIB": "1"},
    "no-llamafile+fa-off": {"LIB": "1", "LLAMA_ARG_FLASH_ATTN": "off"},
    "exact": {"LIB": "1", "EXACT": "1"},
}


def llama_cpp_kernels() -> None:
    """llama.cpp's own kernel choice in this process: repacked weights, whole verify blocks."""
    import localspec.backends.llamacpp.backend as backend_module
    from localspec.backends.llamacpp.kernels import KernelPlan
    from localspec.backends.llamacpp.library import extra_buffers
    from localspec.core.protocol import UNKNOWN

    def plan(path: str, exact: bool, *args: object, **kwargs: object) -> KernelPlan:
        return KernelPlan(extra_buffers() and not exact, None, UNKNOWN)

    backend_module.kernels_for = plan  # type: ignore[assignment]


def child(path: str, repeats: int, plan: str) -> None:
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    if plan == "llama.cpp":
        llama_cpp_kernels()
    backend = LlamaCppBackend(path, n_ctx=1024, threads=2, exact=plan == "exact")
    ids = backend.tokenize(TEXT, add_special=False, parse_special=False)[: DEPTH + 20]

    def timed(fn: Any) -> tuple[float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        return time.process_time() - c0, time.perf_counter() - w0

    out: dict[str, Any] = {}
    n_prefill = int(os.environ.get("LOCALSPEC_PREFILL", PREFILL))

    def prefill() -> None:
        backend.rollback(0)
        backend.eval_block(ids[:n_prefill], "last")

    prefill()  # warm: weights paged in, buffers allocated
    runs = [timed(prefill) for _ in range(repeats)]
    out["prefill"] = [statistics.median(r[i] for r in runs) / n_prefill * 1000 for i in (0, 1)]  # ms/token
    backend.rollback(0)
    backend.eval_block(ids[:DEPTH], "none")
    for k in BLOCKS:
        block = ids[DEPTH : DEPTH + k]

        def verify(block: list[int] = block) -> None:
            backend.eval_block(block, "all")
            backend.rollback(DEPTH)

        verify()
        runs = [timed(verify) for _ in range(repeats * 3)]
        out[f"t{k}"] = [statistics.median(r[i] for r in runs) * 1000 for i in (0, 1)]  # ms/pass
    backend.close()
    print(json.dumps(out))


def run(path: Path, switch: str, nolf: Path | None, repeats: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_ARG_REPACK", "GGML_CPU_TILED_MM")}
    env["OMP_WAIT_POLICY"] = "passive"
    plan = "exact" if "EXACT" in SWITCHES[switch] else SWITCHES[switch].get("PLAN", "localspec")
    for key, value in SWITCHES[switch].items():
        if key == "LIB":
            env["LLAMA_CPP_LIB_PATH"] = str(nolf)
        elif key not in ("PLAN", "EXACT"):
            env[key] = value
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path), str(repeats), plan], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"{path.name} {switch}: {done.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = load
    return result


def report(results: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    """Per switch: the median CPU ms and the default's time over this one, paired by round
    (median, and the range over rounds): under 1 the switch costs, over 1 it saves."""
    keys = ["prefill", *(f"t{k}" for k in BLOCKS)]
    for model, by_switch in results.items():
        base = by_switch["llama.cpp"]
        print(f"\n{model}: CPU ms per prefill token and per pass of k rows; default/this, paired by round")
        print("| switch | " + " | ".join(keys) + " | load |")
        print("|---|" + "---:|" * (len(keys) + 1))
        for switch, rounds in by_switch.items():
            cells = []
            for key in keys:
                ratios = sorted(b[key][0] / r[key][0] for b, r in zip(base, rounds, strict=True))
                cpu = statistics.median(r[key][0] for r in rounds)
                cells.append(f"{cpu:.2f} ({statistics.median(ratios):.2f}x, {ratios[0]:.2f}–{ratios[-1]:.2f})")
            load = statistics.median(r["load"] for r in rounds)
            print(f"| {switch} | " + " | ".join(cells) + f" | {load:.1f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--nolf-lib", type=Path, help="lib folder of a -DGGML_LLAMAFILE=OFF build")
    parser.add_argument("--switches", nargs="+", default=list(SWITCHES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=PREFILL, help="prompt tokens in the prefill block")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    switches = [s for s in args.switches if args.nolf_lib or "LIB" not in SWITCHES[s]]
    if "llama.cpp" not in switches:
        switches.insert(0, "llama.cpp")  # every ratio is against it
    os.environ["LOCALSPEC_PREFILL"] = str(args.prefill)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {m.name: {s: [] for s in switches} for m in args.models}
    for r in range(args.rounds):
        for model in args.models:
            for switch in switches:
                results[model.name][switch].append(run(model, switch, args.nolf_lib, args.repeats))
        print(f"round {r + 1} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
