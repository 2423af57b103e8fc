"""Plain decoding with llama.cpp's flash attention on and off, after a context of each depth:
the localspec backend's single-token passes and, side by side, `llama-bench` on the same model
and threads. Prints one table of tokens/s.

    python benchmarks/flash_attention.py MODEL.gguf [--depths 100,1000,3000] [--peers-bin DIR]

Each setting runs in its own process, since llama.cpp reads the setting at context creation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TOKENS = 48


def ours(model: str, depths: list[int]) -> dict[int, float]:
    """Runs in a child process with LLAMA_ARG_FLASH_ATTN set."""
    from localspec.core.backend_loader import load_backend

    backend = load_backend("llamacpp", model, n_ctx=max(depths) + TOKENS + 8)
    rates = {}
    for depth in depths:
        backend.rollback(0)
        context = [1 + (i * 7) % 30000 for i in range(depth)]
        for start in range(0, depth, 256):
            backend.eval_block(context[start : start + 256], "none")
        t0 = time.perf_counter()
        for i in range(TOKENS):
            backend.eval_block([100 + i], "last")
        rates[depth] = TOKENS / (time.perf_counter() - t0)
    backend.close()
    return rates


def theirs(bin_dir: Path, model: str, depths: list[int], flash: str) -> dict[int, float]:
    cmd = [str(bin_dir / "llama-bench"), "-m", model, "-p", "0", "-n", str(TOKENS), "-fa", flash, "-o", "json"]
    cmd += ["-d", ",".join(map(str, depths)), "--repack", os.environ.get("LLAMA_ARG_REPACK", "0")]
    runs = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return {int(r["n_depth"]): float(r["avg_ts"]) for r in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--depths", default="100,1000,3000")
    parser.add_argument("--peers-bin", help="folder with llama.cpp's llama-bench (omit to skip it)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    if args.child:
        print(json.dumps(ours(args.model, depths)))
        return
    columns: dict[str, dict[int, float]] = {}
    for flash in ("off", "on"):
        env = {**os.environ, "LLAMA_ARG_FLASH_ATTN": flash}
        child = [sys.executable, __file__, args.model, "--depths", args.depths, "--child", "1"]
        out = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
        columns[f"localspec, flash attention {flash}"] = {int(k): v for k, v in json.loads(out).items()}
        if args.peers_bin:
            columns[f"llama-bench -fa {flash}"] = theirs(Path(args.peers_bin), args.model, depths, flash)
    print("| context depth | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for depth in depths:
        print(f"| {depth} | " + " | ".join(f"{c[depth]:.1f}" for c in columns.values()) + " |")


if __name__ == "__main__":
    main()
