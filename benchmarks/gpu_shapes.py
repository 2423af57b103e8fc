"""Speculative decoding at the shapes of the models people run on one GPU, with no download.

Speed does not depend on the weights' values: the torch backend's own Llama-style model is
built at the exact shapes of Llama-3.1-8B, Llama-3.2-1B, Qwen2.5-7B and Qwen2.5-0.5B with
random weights made on the device, in bf16, int8 and int4 (torch's packed kernels), and
every step runs as the backend runs it on CUDA (captured graphs, verification on the device:
only the accepted ids come back). One table:

- plain decode tok/s at batch 1, against the bandwidth limit: bytes read per token (the
  matrices, one embedding row, the KV cache the graphs' attention reads) ÷ the bandwidth a
  device-to-device copy reaches on the same GPU;
- per-step host overhead: a whole engine step (ids in, graph replay with the greedy
  acceptance inside it, two integers out) minus the replay alone;
- t_verify(k)/t_verify(1) for blocks of k = 1..16 tokens;
- for each 8B/7B target with its family's small model as the drafter: the speedup those
  costs give at acceptance rates 0.6, 0.7 and 0.8 with the best fixed γ, and the γ the
  adaptive controller settles on (simulated steps over the measured costs) with its
  speedup, which should land within 5 % of the best fixed γ's.

    python benchmarks/gpu_shapes.py                 # a CUDA GPU: the four shapes, ~2-4 minutes
    python benchmarks/gpu_shapes.py --tiny          # any machine: tiny shapes, a smoke test
    python benchmarks/gpu_shapes.py --project RUN.txt ...   # the projections again from saved runs

For comparison, gpt-fast's published Llama-2-7B figures on an A100 (~1,700 GB/s): bf16 104.9
tok/s (82 % of bandwidth), int8 155.6 (63 %), int4 g32 196.8 (51 %); speculative: a 70B int4
verifier with a 7B int4 drafter at 48.4 tok/s against 25.25 plain (1.92x).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from localspec.backends.torch import quantized, verify
from localspec.backends.torch.cuda import GREEDY, GraphedSteps
from localspec.backends.torch.layers import KVCache, Model, eager_block
from localspec.backends.torch.shapes import SHAPES, random_model
from localspec.control.replay import projection_rows

PAIRS = {"llama-3.1-8b": "llama-3.2-1b", "qwen2.5-7b": "qwen2.5-0.5b"}
KINDS = ("bf16", "int8", "int4")  # bf16 is float32 on a CPU (--tiny)
ALPHAS = (0.6, 0.7, 0.8)
MAX_K = 16


@dataclass
class Measured:
    shape: str
    kind: str
    bytes_per_token: int
    gpu_step: float  # seconds: one decode step's replay alone
    engine_step: float  # seconds: the whole step, as the engine runs it
    curve: list[float]  # seconds for blocks of 1..MAX_K tokens, whole steps


class Runner:
    """One model with its static KV cache, stepped as the torch backend steps it."""

    def __init__(self, model: Model, n_ctx: int, device: torch.device, dtype: torch.dtype) -> None:
        c = model.config
        self.model, self.device, self.dtype = model, device, dtype
        self.cache = KVCache(c.n_layers, c.n_kv_heads, n_ctx, c.head_dim, dtype, device)
        self.graphs: GraphedSteps | None = None
        if device.type == "cuda":
            self.graphs = GraphedSteps(model, self.cache, MAX_K, True, False)

    def logits(self, tokens: list[int], past: int) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs.run_on_device(tokens, past, "all")
        n = len(tokens)
        ids = torch.tensor(tokens, device=self.device)
        positions = torch.arange(past, past + n, device=self.device)
        return self.model.forward(ids, eager_block(positions, past, n, 0, self.dtype), self.cache, "all")

    def step(self, k: int, past: int) -> tuple[int, int]:
        """One verify step of a k-token block (k - 1 drafted tokens), greedy, on the device."""
        tokens = [(7 * i + 3) % 100 for i in range(k)]
        with torch.inference_mode():
            if self.graphs is not None:  # the backend's greedy step: the rule inside the graph
                n_acc, token = self.graphs.run_on_device(tokens, past, GREEDY).tolist()
                return int(n_acc), int(token)
            outcome: tuple[int, int] = verify.accept_greedy(tokens[1:], self.logits(tokens, past))
        return outcome

    def replay_only(self) -> Callable[[], None] | None:
        if self.graphs is None:
            return None
        graph: torch.cuda.CUDAGraph = self.graphs.graphs[(1, GREEDY)][0]
        replay: Callable[[], None] = graph.replay
        return replay

    def release(self) -> None:
        if self.graphs is not None:
            self.graphs.release()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    for _ in range(3):
        fn()
    runs = []
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        runs.append((time.perf_counter() - t0) / reps)
    return statistics.median(runs)


def bandwidth(device: torch.device, size: int) -> float:
    """Bytes per second a device-to-device copy moves (each byte read once, written once)."""
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, 20 if device.type == "cuda" else 3)
    return 2 * size / seconds


def read_per_token(name: str, kind: str, n_ctx: int) -> int:
    config, tied, _ = SHAPES[name]
    layout = "dense" if kind == "bf16" else kind
    weights = quantized.model_bytes(config, layout, tied, head=quantized.head_kind(layout, quantized.Q6_K))
    if not (tied and layout == "dense"):
        weights -= config.vocab_size * config.hidden * 2  # the embedding table: one row a token
    return weights + quantized.kv_cache_bytes(config, n_ctx)


def measure(name: str, kind: str, device: torch.device, dtype: torch.dtype, n_ctx: int, reps: int) -> Measured:
    layout = "dense" if kind == "bf16" else kind
    with torch.inference_mode():
        model = random_model(name, layout, n_ctx, device, dtype)
    runner = Runner(model, n_ctx, device, dtype)
    try:
        curve, gpu = timings(runner, n_ctx // 2, reps)
    finally:
        runner.release()
        del runner, model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return Measured(name, kind, read_per_token(name, kind, n_ctx), gpu, curve[0], curve)


def timings(runner: Runner, past: int, reps: int) -> tuple[list[float], float]:
    """Whole verify steps of 1..MAX_K tokens, and one decode step's replay alone."""
    runner.step(MAX_K, past)  # on CUDA: captures every block size's graph at once
    curve = []
    for k in range(1, MAX_K + 1):
        curve.append(timed(lambda k=k: runner.step(k, past), runner.device, reps))  # type: ignore[misc]
    replay = runner.replay_only()
    return curve, timed(replay, runner.device, reps) if replay is not None else curve[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on whatever device: a smoke test")
    parser.add_argument("--kinds", default=",".join(KINDS), help="bf16,int8,int4 (default: all)")
    parser.add_argument("--n-ctx", type=int, default=512, help="the KV cache (the graphs' attention reads all of it)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--fit-ctx", type=int, default=4096, help="CUDA: the KV cache of the memory check (0: skip)")
    parser.add_argument("--project", nargs="+", metavar="OUTPUT", help="projections from saved outputs of this script")
    args = parser.parse_args(argv)
    if args.project:
        saved = {(m.shape, m.kind): m for path in args.project for m in read_rows(path)}
        kinds = list(dict.fromkeys(kind for _, kind in saved))
        known = {**PAIRS, "tiny": "tiny"}
        pairs = {t: d for t, d in known.items() if all((t, k) in saved and (d, k) in saved for k in kinds)}
        print_projection(saved, pairs, kinds)
        return
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if not args.tiny and device.type != "cuda":
        sys.exit("no CUDA device: run on a GPU, or pass --tiny for the CPU smoke test")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.tiny:
        torch.set_num_threads(1)  # tiny matrices: more threads only wait on each other
    kinds = args.kinds.split(",")
    pairs = {"tiny": "tiny"} if args.tiny else PAIRS
    names = list(dict.fromkeys([*pairs, *pairs.values()]))
    bw = bandwidth(device, (1 << 30) if device.type == "cuda" else (1 << 26))
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# {what}, torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s; KV cache {args.n_ctx}")
    results: dict[tuple[str, str], Measured] = {}
    start = time.perf_counter()
    print_table_head()
    for kind in kinds:
        for name in names:  # each row as soon as it is measured: a cut run keeps what it had
            print(f"  {time.perf_counter() - start:5.0f} s: measuring {name} {kind}", file=sys.stderr, flush=True)
            results[name, kind] = measure(name, kind, device, dtype, args.n_ctx, args.reps)
            print_row(results[name, kind], bw)
    print_projection(results, pairs, kinds)
    if device.type == "cuda" and args.fit_ctx:
        print_fit(pairs, kinds, device, dtype, args.fit_ctx)


def print_table_head() -> None:
    ratios = " ".join(f"{k:>4}" for k in range(2, MAX_K + 1))
    head = f"{'model':<14}{'kind':<6}{'MB/tok':>8} {'tok/s':>8} {'limit':>9} {'of bw':>6} {'host ms':>8}"
    print(f"\n{head}  t(k)/t(1): {ratios}")


def print_row(m: Measured, bw: float) -> None:
    limit = bw / m.bytes_per_token
    tok_s = 1 / m.engine_step
    host = (m.engine_step - m.gpu_step) * 1e3
    curve = " ".join(f"{t / m.curve[0]:4.2f}" for t in m.curve[1:])
    print(
        # A space between every column: a saved run is read back by splitting on them (read_rows).
        f"{m.shape:<14}{m.kind:<6}{m.bytes_per_token / 1e6:8.0f} {tok_s:8.1f} {limit:9.1f} {tok_s / limit:6.0%}"
        f" {host:8.3f}  {'':11}{curve}",
        flush=True,
    )


def read_rows(path: str) -> list[Measured]:
    """The measured rows of a saved output (tok/s, host ms and t(k)/t(1) give the curve back)."""
    rows = []
    with open(path, encoding="utf-8") as saved:
        lines = saved.read().splitlines()
    for line in lines:
        fields = line.split()
        if len(fields) == 7 + MAX_K - 1 and fields[0] in SHAPES and fields[1] in KINDS:
            step = 1 / float(fields[3])
            curve = [step, *(step * float(r) for r in fields[7:])]
            host = float(fields[6]) / 1e3
            rows.append(Measured(fields[0], fields[1], int(float(fields[2]) * 1e6), step - host, step, curve))
    return rows


def print_projection(results: dict[tuple[str, str], Measured], pairs: dict[str, str], kinds: list[str]) -> None:
    head = f"{'target <- drafter':<30}{'kind':<6}{'alpha':>6}{'best γ':>7}{'speedup':>8}"
    print(f"\n{head}{'adaptive γ':>11}{'speedup':>8}{'of best':>8}", flush=True)
    for target, drafter in pairs.items():
        for kind in kinds:
            t, d = results[target, kind], results[drafter, kind]
            for alpha, best, best_speed, chosen, chosen_speed in projection_rows(t.curve, d.engine_step, ALPHAS):
                print(
                    f"{target + ' <- ' + drafter:<30}{kind:<6}{alpha:6.1f}{best:7d}{best_speed:7.2f}x"
                    f"{chosen:11d}{chosen_speed:7.2f}x{chosen_speed / best_speed:8.0%}"
                )


def resident(target: str, drafter: str, kind: str, device: torch.device, dtype: torch.dtype, n_ctx: int) -> int:
    """Bytes the allocator holds for a target and its drafter together on the GPU, each with a
    KV cache of n_ctx tokens and its captured graphs, at the peak of a verify step."""
    layout = "dense" if kind == "bf16" else kind
    runners: list[Runner] = []
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    try:
        for name in (target, drafter):
            with torch.inference_mode():
                model = random_model(name, layout, n_ctx, device, dtype)
            runners.append(Runner(model, n_ctx, device, dtype))
            del model
            runners[-1].step(MAX_K, n_ctx - MAX_K)  # every block size's graph captured
        gc.collect()
        torch.cuda.reset_peak_memory_stats(device)  # building random weights peaks higher than a load
        for runner in runners:
            runner.step(MAX_K, n_ctx - MAX_K)
        return int(torch.cuda.max_memory_allocated(device) - base)
    finally:
        for runner in runners:
            runner.release()
        runners.clear()
        gc.collect()
        torch.cuda.empty_cache()


def print_fit(pairs: dict[str, str], kinds: list[str], device: torch.device, dtype: torch.dtype, n_ctx: int) -> None:
    """Does a pair fit a consumer card: what both models take, KV caches and graphs included."""
    free, total = torch.cuda.mem_get_info(device)
    context = total - free - torch.cuda.memory_reserved(device)  # the CUDA context and kernels
    print(f"\n{'target + drafter, resident':<34}{'kind':<6}{'KV ctx':>7}{'GiB':>7}{'+ CUDA context':>15}")
    for target, drafter in pairs.items():
        for kind in kinds:
            held = resident(target, drafter, kind, device, dtype, n_ctx)
            pair = f"{target} + {drafter}"
            print(f"{pair:<34}{kind:<6}{n_ctx:>7}{held / 2**30:7.2f}{(held + context) / 2**30:15.2f}")


if __name__ == "__main__":
    main()
