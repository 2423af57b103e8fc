"""`localspec serve` on a GPU build's device: `--parallel 4` (lanes on the device, their shared
passes sized by the load's device check) against `--parallel 1` (one request at a time), on the
same GGUF, every layer on the device:

- the Open WebUI flow (concurrency.py): title and tags seconds while a chat stream runs;
- aggregate and per-request tokens/s with 1, 2 and 4 clients at once (greedy, 128 tokens, the
  copying prompts; after a round of 4 that is not counted);
- how many of 10 answers (greedy and seeded) differ between alone and 4 clients at once.

Run it with a GPU build's Python; on Mesa's software Vulkan device (lavapipe, .ci/vulkan.sh's
venv) name the device first:

    GGML_VK_VISIBLE_DEVICES=0 ~/.cache/localspec-ci/vulkan/venv/bin/python benchmarks/gpu_lanes.py [--rounds 3]

Prints Markdown tables; a throughput cell is the median of --rounds rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import psutil
from concurrency import COPYING, Server, identity, serving, side_requests, throughput

from localspec.backends.llamacpp.gpu import gpu_device
from localspec.models.default_model import ensure_pypi_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stream-tokens", type=int, default=200)
    args = parser.parse_args()
    device = gpu_device()
    if device is None:
        sys.exit("no GPU device seen: run it with a GPU build (on lavapipe: GGML_VK_VISIBLE_DEVICES=0)")
    model = args.model or str(ensure_pypi_model())
    base = [sys.executable, "-m", "localspec", "serve", "--model", model, "--threads", str(args.threads)]
    base += ["--no-memory", "--gpu-layers", "99", "-s", "ngram"]
    servers = [
        Server(f"--parallel {n}", lambda port, n=n: [*base, "--parallel", str(n), "--port", str(port)]) for n in (4, 1)
    ]
    print(f"# serve on {device.name}, {model.rsplit('/', 1)[-1]}, {time.strftime('%Y-%m-%d')}\n")
    print(f"| server | title s | tags s (a {args.stream_tokens}-token stream running) |\n|---|---|---|")
    for server in servers:
        with serving(server) as (_, url):
            title, tags = side_requests(url, args.stream_tokens)
            print(f"| {server.name} | {title:.2f} | {tags:.2f} |", flush=True)
    print("\n| server | clients | aggregate tok/s | per-request tok/s | answers differing alone / 4 at once |")
    print("|---|---|---|---|---|")
    for server in servers:
        with serving(server) as (proc, url):
            process = psutil.Process(proc.pid)
            # Lavapipe compiles a pipeline the first time a process runs a pass of its shape:
            # a round first, not counted, so that the rounds time passes, not LLVM.
            throughput(url, 4, process, args.rounds, COPYING)
            for clients in (1, 2, 4):
                runs = [throughput(url, clients, process, r, COPYING) for r in range(args.rounds)]
                agg, each = (statistics.median(r[i] for r in runs) for i in (0, 1))
                differ = f"{identity(url)} of 10" if clients == 4 else ""
                print(f"| {server.name} | {clients} | {agg:.1f} | {each:.1f} | {differ} |", flush=True)


if __name__ == "__main__":
    main()
