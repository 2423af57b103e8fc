"""Plain decoding in a raw llama-cpp-python loop, no localspec code: what the context localspec
opens, the argmax in llama.cpp's graph (backends/llamacpp/greedy.py) and OpenMP's idle workers
cost a pass, each against its alternative, interleaved and paired round by round.

    python benchmarks/raw_loop.py loop MODEL.gguf [--rounds 8]     # 2 threads, tokens a second
    python benchmarks/raw_loop.py blocks MODEL.gguf [--rows 1,2,5,9] # 1 thread, thread CPU a pass
    python benchmarks/raw_loop.py gap MODEL.gguf [--gap-us 200]     # 2 threads; run again with
                                                                    # GOMP_SPINCOUNT=... set
    python benchmarks/raw_loop.py prompt MODEL.gguf [--prompt-rows 46] # 2 threads, ms a prompt
    python benchmarks/raw_loop.py threads MODEL.gguf                # 2 threads, ms a pass

loop: localspec's context (16 sequences on a unified cache, 4,096 cells, 64-row batches) with
numpy's argmax over the row, the same with the graph's argmax, and a context as llama-bench
opens it. blocks: passes of k rows with every row's argmax taken by numpy or by the graph, as
thread CPU time (one thread: all of ggml's work is on it, so load does not stretch it). gap: the time
in llama_decode with a busy wait between passes, as the host's Python makes, against none.
prompt: a prompt's pass into an empty cache, the last row's logits only, in localspec's
context, in it with one sequence, and in a context as llama-server opens it (--parallel 1).
threads: the same one-token passes run by the main thread alone, then by a second thread while
the main thread, which ran passes before, lives on (its OpenMP team with it), then by the main
thread again: phases one after another, so the host's drift between them counts too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import llama_cpp as L
import numpy as np

TOKENS = 128


def open_context(model: Any, threads: int, kind: str) -> Any:
    c = L.llama_context_default_params()
    c.n_threads = c.n_threads_batch = threads
    c.no_perf = True
    if kind == "bench":  # llama-bench's tg: a context of the test's size, one sequence
        c.n_ctx, c.n_batch, c.n_ubatch, c.n_seq_max = TOKENS + 1, 2048, 512, 1
    elif kind == "server":  # llama-server -c 4096 --parallel 1
        c.n_ctx, c.n_batch, c.n_ubatch, c.n_seq_max = 4096, 2048, 512, 1
    else:  # backends/llamacpp/backend.py's _make_context
        c.n_ctx, c.n_batch, c.n_ubatch, c.swa_full, c.n_outputs_max_per_seq = 4096, 64, 64, True, 0
        stateful = L.llama_model_is_recurrent(model) or L.llama_model_is_hybrid(model)
        c.kv_unified, c.n_seq_max = not stateful, 1 if stateful or kind == "one sequence" else 16
    ctx = L.llama_init_from_model(model, c)
    if kind == "graph":
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        if not L.llama_set_sampler(ctx, 0, chain):
            raise SystemExit("llama.cpp refused the greedy sampler on this context")
    return ctx


class Passes:
    """One context and a batch of up to 64 rows, every row an output."""

    def __init__(self, model: Any, threads: int, kind: str) -> None:
        self.ctx, self.graph = open_context(model, threads, kind), kind == "graph"
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        self.batch = L.llama_batch_init(64, 0, 1)
        for i in range(64):
            self.batch.n_seq_id[i], self.batch.logits[i] = 1, 1
            self.batch.seq_id[i][0] = 0

    def prompt(self, rows: int) -> float:
        """Seconds of one pass of `rows` prompt tokens into an empty cache, the last row's
        logits only (the first token's), as a server's prompt pass."""
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        b = self.batch
        b.n_tokens = rows
        for i in range(rows):
            b.token[i], b.pos[i], b.logits[i] = 10 + i, i, int(i == rows - 1)
        t0 = time.perf_counter()
        if L.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")
        seconds = time.perf_counter() - t0
        for i in range(rows):
            b.logits[i] = 1
        return seconds

    def run(self, rows: int, passes: int, gap_s: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> float:
        """Seconds (of `clock`) a pass, from an empty cache; self.decode_s: those in llama_decode."""
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        b, token = self.batch, 10
        b.n_tokens = rows
        self.decode_s = 0.0
        t0 = clock()
        for p in range(passes):
            for i in range(rows):
                b.token[i], b.pos[i] = token + i, p * rows + i
            d0 = clock()
            if L.llama_decode(self.ctx, b) != 0:
                raise SystemExit("llama_decode failed")
            self.decode_s += (clock() - d0) / passes
            if self.graph:
                token = min(L.llama_get_sampled_token_ith(self.ctx, i) for i in range(rows))
            else:
                logits = np.ctypeslib.as_array(L.llama_get_logits(self.ctx), shape=(rows, self.n_vocab))
                token = int(logits.argmax(axis=1).min())
            token = token % 1000 + 10  # a real id, whatever a random model picks
            end = time.perf_counter() + gap_s
            while time.perf_counter() < end:
                pass
        return (clock() - t0) / passes


def paired(results: dict[str, list[float]], base: str) -> None:
    for name, values in results.items():
        print(f"{name:<28} median {statistics.median(values):9.4f}   " + " ".join(f"{v:.4f}" for v in values))
    for name, values in results.items():
        if name != base:
            ratios = sorted(v / b for v, b in zip(values, results[base], strict=True))
            low, high = ratios[0], ratios[-1]
            print(f"{name} / {base}: paired median {statistics.median(ratios):.3f} [{low:.3f} .. {high:.3f}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["loop", "blocks", "gap", "prompt", "threads"])
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--rows", default="1,2,5,9")
    p.add_argument("--gap-us", type=float, default=200.0)
    p.add_argument("--prompt-rows", type=int, default=46)
    args = p.parse_args()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    print(f"# {os.path.basename(args.model)}, {args.mode}, 1-minute load {os.getloadavg()[0]:.2f}")
    if args.mode == "loop":  # tokens a second, 2 threads
        kinds = {
            "localspec, numpy argmax": "ours",
            "localspec, graph argmax": "graph",
            "llama-bench's context": "bench",
        }
        loops = {name: Passes(model, 2, kind) for name, kind in kinds.items()}
        results: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(args.rounds):
            for name, loop in loops.items():
                results[name].append(1 / loop.run(1, TOKENS))
        paired(results, "localspec, numpy argmax")
    elif args.mode == "blocks":  # thread CPU ms a pass, 1 thread
        host, graph = Passes(model, 1, "ours"), Passes(model, 1, "graph")
        for rows in (int(x) for x in args.rows.split(",")):
            cpu: dict[str, list[float]] = {"numpy argmax": [], "graph argmax": []}
            for _ in range(args.rounds):
                cpu["numpy argmax"].append(1e3 * host.run(rows, 48, clock=time.thread_time))
                cpu["graph argmax"].append(1e3 * graph.run(rows, 48, clock=time.thread_time))
            print(f"## {rows} row(s) a pass, thread CPU ms")
            paired(cpu, "numpy argmax")
    elif args.mode == "prompt":  # ms a prompt's pass, 2 threads, the contexts in turn
        contexts = {"localspec's context": "ours", "with one sequence": "one sequence", "llama-server's": "server"}
        passes = {name: Passes(model, 2, kind) for name, kind in contexts.items()}
        ms: dict[str, list[float]] = {name: [] for name in passes}
        for _ in range(args.rounds):
            for name, runner in passes.items():
                ms[name].append(1e3 * statistics.median(runner.prompt(args.prompt_rows) for _ in range(5)))
        print(f"## a prompt of {args.prompt_rows} rows, ms a pass (median of 5 a round)")
        paired(ms, "llama-server's")
    elif args.mode == "threads":  # ms a pass, 2 threads: the main thread alone, then two threads' teams
        loop = Passes(model, 2, "ours")
        other = ThreadPoolExecutor(max_workers=1)
        phases = {
            "the main thread, the only one that ran passes": lambda: loop.run(1, TOKENS),
            "a second thread, the main thread's team alive": lambda: other.submit(loop.run, 1, TOKENS).result(),
            "the main thread again": lambda: loop.run(1, TOKENS),
        }
        print("ms a one-token pass (libgomp spins at a barrier only while its threads fit the CPUs)")
        for name, phase in phases.items():
            ms = [1e3 * phase() for _ in range(args.rounds)]
            print(f"{name:<48} median {statistics.median(ms):7.3f}   " + " ".join(f"{v:.3f}" for v in ms))
    else:  # ms in llama_decode a step, with and without a busy gap between passes, 2 threads
        loop = Passes(model, 2, "ours")
        gap = f"{args.gap_us:.0f} us gap"
        decode: dict[str, list[float]] = {"no gap": [], gap: []}
        for _ in range(args.rounds):
            for name, seconds in (("no gap", 0.0), (gap, args.gap_us * 1e-6)):
                loop.run(1, TOKENS, seconds)
                decode[name].append(1e3 * loop.decode_s)
        print(f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '-')}: ms in llama_decode a step")
        paired(decode, "no gap")


if __name__ == "__main__":
    main()
