"""The host's time per plain decoding step: everything a step spends outside llama.cpp's
llama_decode, split into its parts, beside bare loops that only call llama_decode and read
the argmax, numpy's over the row or the one llama.cpp's graph took (the least any Python loop
can spend; llama-bench's tg test does the passes in C and reads nothing).

Each part's own time (children excluded) is measured with perf_counter around it; the main
thread's CPU time (thread_time) is measured beside it, since on a shared host the wall clock
also counts the time this process was not scheduled. llama_decode runs on the calling thread
(it is ggml's worker 0), so host CPU = the main thread's CPU time outside llama_decode.

    python benchmarks/host_time.py MODEL.gguf [--threads 1] [--tokens 256] [--repeats 3]
    python benchmarks/host_time.py --random-vocab 248320   # a random model of a real vocabulary's size

Each drafter's host time a step, split into steps where it guessed and steps where it did not:

    python benchmarks/host_time.py --drafters-replay [--repeats 3]   # n-gram and the memory, no model
    python benchmarks/host_time.py MODEL.gguf --drafters [--draft DRAFT.gguf] [--session product_yaml]

--drafters-replay replays SmolLM2-135M's recorded greedy answers to the sessions of
benchmarks/prompts_sessions.jsonl (tests/data/session_answers.json) through the real engine and
n-gram drafter on a simulated clock, the memory holding each session's earlier requests as a
runtime's does, plus two harder cases: a memory of 100,000 tokens and a copy-like answer whose
every line repeats. --drafters runs a session of real requests through Runtime (plain, n-gram,
n-gram with the memory, the draft model given, and the model's own MTP head where its GGUF ships
one), timing the drafters' own calls, llama_decode excluded, so a draft model's figure is its
host-side work; and the controller's (the draft-length policy's calls) a step apart.

The random model (localspec/testing/gguf_writer.py's qwen35 shape, 248,320 tokens as Qwen3.5's) is where
the vocabulary-sized work of a step (reading a row of logits) dominates.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.api import Runtime, runtime_for
from localspec.backends.llamacpp import backend as llamacpp_backend
from localspec.backends.llamacpp.greedy import DeviceGreedy
from localspec.common.templates import render_chat
from localspec.common.textstream import TextAssembler
from localspec.control.factory import ngram_policy
from localspec.control.prompts import SUITE
from localspec.control.replay import Truth, calibration_from_doctor, replay
from localspec.core import engine as engine_module
from localspec.core.backend_loader import load_backend
from localspec.core.drafting import Draft
from localspec.core.stats import Stats
from localspec.drafters.memory import NgramMemory
from localspec.drafters.ngram import NgramDrafter
from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

DECODE = "llama_decode"
PARTS = {
    DECODE: "llama_decode (the backend's pass)",
    "batch": "eval_block around it: batch fill, checks, logits view",
    "verify": "verify_block around that (the backend's acceptance rule)",
    "picks": "the argmax token ids read back (greedy.py)",
    "rollback": "rollback (llama_memory_seq_rm)",
    "accept": "the host's greedy argmax over the logits rows",
    "shape": "shape() (penalties, bias, grammar mask)",
    "drafter": "drafter propose/commit (none)",
    "policy": "draft-length policy choose/observe",
    "stats": "stats (Stats.record_step)",
    "text": "detokenising and stop strings (TextAssembler.push)",
    "engine": "the engine's step loop itself (Step, stop checks, ...)",
    "stream": "stream machinery (Runtime's generator, lock, TextDelta)",
}


class Clock:
    """Own time per named part (a part's children are not its own), wall and thread CPU."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._stack: list[list[Any]] = []

    def enter(self, name: str) -> None:
        self._stack.append([name, time.perf_counter(), time.thread_time(), 0.0, 0.0])

    def exit(self) -> None:
        name, w0, c0, child_w, child_c = self._stack.pop()
        dw, dc = time.perf_counter() - w0, time.thread_time() - c0
        self.wall[name] += dw - child_w
        self.cpu[name] += dc - child_c
        if self._stack:
            self._stack[-1][3] += dw
            self._stack[-1][4] += dc

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()

        return timed

    def wrap_steps(self, name: str, steps: Iterator[Any]) -> Iterator[Any]:
        """A generator's time, one next() at a time (its consumer's time is not its own)."""
        while True:
            self.enter(name)
            try:
                item = next(steps)
            except StopIteration:
                return
            finally:
                self.exit()
            yield item


def instrument(clock: Clock, runtime: Runtime, parts: bool = True) -> Callable[[], None]:
    """Time llama_decode and (parts) every other part of runtime's step; returns what undoes it."""
    undo: list[Callable[[], None]] = []

    def patch(owner: Any, attr: str, name: str) -> None:
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        setattr(owner, attr, clock.wrap(name, getattr(owner, attr)))
        undo.append(lambda: setattr(owner, attr, original))

    patch(llama_cpp, "llama_decode", DECODE)
    if parts:
        patch(llamacpp_backend.LlamaCppBackend, "eval_block", "batch")
        patch(llamacpp_backend.LlamaCppBackend, "rollback", "rollback")
        patch(llamacpp_backend.LlamaCppBackend, "verify_block", "verify")
        patch(DeviceGreedy, "picks", "picks")
        patch(engine_module, "accept_greedy", "accept")
        patch(engine_module, "shape", "shape")
        for attr in ("propose", "commit", "backlog"):
            patch(runtime.drafter, attr, "drafter")
        for attr in ("choose", "observe"):
            patch(runtime.policy, attr, "policy")
        patch(Stats, "record_step", "stats")
        patch(TextAssembler, "push", "text")
        engine = runtime.engine
        generate = engine.generate

        def timed_generate(*args: Any, **kwargs: Any) -> Iterator[Any]:
            return clock.wrap_steps("engine", generate(*args, **kwargs))

        engine.generate = timed_generate  # type: ignore[method-assign]
        undo.append(lambda: delattr(engine, "generate"))

    def restore() -> None:
        for u in reversed(undo):
            u()

    return restore


def bare_loop(
    target: Any, prompt: list[int], n_tokens: int, in_graph: bool = False
) -> tuple[int, int, float, float, float, float]:
    """llama_decode one token at a time and the argmax of its row, nothing else: numpy's over
    the row, or (in_graph) the id llama.cpp's graph took (greedy.py). Returns tokens, steps,
    wall, main-thread CPU, and the same two inside llama_decode."""
    target.rollback(0)
    target.eval_block(prompt[:-1], "none")
    backend = target
    batch, ctx, rows = backend._batch, backend._ctx, backend._logits
    backend._greedy.detach()
    if in_graph:
        backend._greedy.wanted = True
        backend._greedy.attach()
        backend._greedy.wanted = False
    get = llama_cpp.llama_get_sampled_token_ith
    backend._out[0] = 1
    backend._tok[0] = prompt[-1]
    past = len(prompt) - 1
    decode_w = decode_c = 0.0
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n_tokens):
        backend._pos[0] = past + i
        batch.n_tokens = 1
        d0, e0 = time.perf_counter(), time.thread_time()
        llama_cpp.llama_decode(ctx, batch)
        decode_w += time.perf_counter() - d0
        decode_c += time.thread_time() - e0
        if in_graph:
            backend._tok[0] = get(ctx, 0)
        else:
            backend._tok[0] = int(np.argmax(rows.rows(1)[0]))
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    llama_cpp.llama_memory_seq_rm(backend._mem, 0, 0, -1)
    backend._tokens.clear()
    return n_tokens, n_tokens, wall, cpu, decode_w, decode_c


def run_once(runtime: Runtime, prompt: list[int], n_tokens: int, clock: Clock) -> tuple[int, int, float, float]:
    """One plain request whose prompt is in the cache already (the prompt's evaluation is
    no decoding step): its steps, tokens, wall time and main-thread CPU time."""
    clock.enter("stream")
    t0, c0 = time.perf_counter(), time.thread_time()
    out = runtime.generate(prompt, max_tokens=n_tokens, temperature=0.0)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    clock.exit()
    return out.stats.verify_steps, out.stats.generated_tokens, wall, cpu


def random_vocab_model(vocab: int, folder: Path) -> Path:
    spec = HybridSpec(layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=768, vocab=vocab, n_ctx=4096)
    return write_qwen35_gguf(spec, folder / f"random-{vocab}.gguf")


ROOT = Path(__file__).resolve().parents[1]
SESSION_ANSWERS = ROOT / "tests" / "data" / "session_answers.json"
SUITE_ANSWERS = ROOT / "tests" / "data" / "replay_answers.json"
REPLAY_CURVES = ROOT / "tests" / "data" / "replay_curves.json"
SESSIONS = Path(__file__).with_name("prompts_sessions.jsonl")
Q4_1_STEP_US = 1e6 / 190  # a plain step of the default model (SmolLM2-135M Q4_1) at 190 tok/s
BIG_MEMORY = 100_000  # tokens: half the memory's capacity
Requests = list[tuple[list[int], list[int]]]


class DrafterSteps:
    """The drafters' own host time per engine step (their calls' own time on the Clock, so
    llama_decode excluded), filed under whether a guess came back in that step."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.guessed = False
        self._seen = (0.0, 0.0)
        self.steps: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        self._controller = 0.0
        self.controller: list[float] = []  # the policy's CPU seconds a step, where watched

    def watch(self, drafter: Any, name: str) -> Callable[[], None]:
        """Time one drafter's calls under `name`; returns what undoes it."""
        for attr in ("propose", "commit", "backlog"):
            setattr(drafter, attr, self.clock.wrap(name, getattr(drafter, attr)))
        timed = drafter.propose

        def noting(*args: Any, **kwargs: Any) -> Draft:
            draft: Draft = timed(*args, **kwargs)
            self.guessed |= bool(draft.tokens)
            return draft

        drafter.propose = noting

        def undo() -> None:
            for attr in ("propose", "commit", "backlog"):
                delattr(drafter, attr)

        return undo

    def watch_policy(self, policy: Any) -> Callable[[], None]:
        """Time the draft-length policy's calls of a step (the controller) apart; returns what undoes it."""
        names = [a for a in ("choose", "choose_source", "would_guess", "observe") if hasattr(policy, a)]
        for attr in names:
            setattr(policy, attr, self.clock.wrap("controller", getattr(policy, attr)))

        def undo() -> None:
            for attr in names:
                delattr(policy, attr)

        return undo

    def step(self) -> None:
        """One engine step is over: its drafter time goes to its bucket."""
        wall = sum(self.clock.wall[n] for n in ("drafter", "lookup"))
        cpu = sum(self.clock.cpu[n] for n in ("drafter", "lookup"))
        self.steps[self.guessed].append((wall - self._seen[0], cpu - self._seen[1]))
        self.controller.append(self.clock.cpu["controller"] - self._controller)
        self._seen, self.guessed, self._controller = (wall, cpu), False, self.clock.cpu["controller"]

    def recording(self) -> Callable[[], None]:
        """Close a step at every Stats.record_step (the engine records each step once)."""
        record = Stats.record_step

        def recorded(stats: Stats, step: Any) -> None:
            record(stats, step)
            self.step()

        Stats.record_step = recorded  # type: ignore[method-assign,assignment]
        return lambda: setattr(Stats, "record_step", record)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for guessed, label in ((False, "no guess"), (True, "guess")):
            times = self.steps[guessed]
            wall, cpu = (sorted(t[i] * 1e6 for t in times) for i in (0, 1))
            out[label] = {
                "steps": len(times),
                "cpu_us_mean": sum(cpu) / len(cpu) if cpu else 0.0,
                "cpu_us_median": cpu[len(cpu) // 2] if cpu else 0.0,
                "cpu_us_p99": cpu[int(len(cpu) * 0.99)] if cpu else 0.0,
                "wall_us_mean": sum(wall) / len(wall) if wall else 0.0,
            }
        if any(self.controller):
            out["controller"] = {"cpu_us_mean": 1e6 * sum(self.controller) / len(self.controller)}
        return out


def recorded_sessions() -> tuple[dict[str, Requests], int]:
    data = json.loads(SESSION_ANSWERS.read_text())
    sessions = {name: [(list(r["prompt"]), list(r["answer"])) for r in reqs] for name, reqs in data["sessions"].items()}
    return sessions, int(data["n_vocab"])


def big_memory() -> NgramMemory:
    """A memory of BIG_MEMORY tokens: every recorded prompt and answer, over and over, so the
    chat template's KEY-grams each have thousands of earlier places."""
    sessions, _ = recorded_sessions()
    suite = json.loads(SUITE_ANSWERS.read_text())["answers"].values()
    documents = [p + a for reqs in sessions.values() for p, a in reqs]
    documents += [list(r["prompt"]) + list(r["answer"]) for r in suite]
    memory = NgramMemory()
    while len(memory) < BIG_MEMORY:
        for document in documents:
            memory.add(document)
    return memory


def copy_like() -> Requests:
    """An answer made of one line repeated with a changing value (a list, a CSV, a table): every
    step's last token occurred at dozens of places that each match far back."""
    line = [1241, 1002, 476, 7356, 1799, 0, 30, 198]
    answer = [t if t else 33 + i % 10 for i in range(40) for t in line]
    return [([1, 9690, 198, 4093, 198, 3725, *line[:5], 198], answer)]


def replay_case(requests: Requests, memory: NgramMemory | None, n_vocab: int, record: DrafterSteps) -> None:
    """Requests replayed in order on the Q4_1 curve, the memory (if any) taking each one after."""
    cal = calibration_from_doctor(json.loads(REPLAY_CURVES.read_text())["smollm2-135m-q4_1"])
    truth, policy = Truth.of(cal), ngram_policy(cal.cost_curve())
    for prompt, answer in requests:
        drafter = NgramDrafter(memory=memory)
        undo = record.watch(drafter, "drafter")
        replay(prompt, answer, truth, n_vocab, policy, drafter=drafter)
        undo()
        if memory is not None:
            memory.add(prompt + answer)


Case = list[tuple[Requests, Callable[[], NgramMemory | None]]]


def replay_cases() -> tuple[dict[str, Case], int]:
    sessions, n_vocab = recorded_sessions()
    return {
        "n-gram": [(reqs, lambda: None) for reqs in sessions.values()],
        "n-gram + memory of the session": [(reqs, NgramMemory) for reqs in sessions.values()],
        f"n-gram + memory of {BIG_MEMORY:,} tokens": [(reqs, big_memory) for reqs in sessions.values()],
        "n-gram, copy-like answer": [(copy_like(), lambda: None)],
    }, n_vocab


def timer_floor() -> float:
    """The Clock's own CPU time inside one timed call of a function that does nothing: a step
    of the replay times two calls (propose, commit)."""
    clock, calls = Clock(), 20_000
    nothing = clock.wrap("nothing", lambda: None)
    for _ in range(calls):
        nothing()
    return clock.cpu["nothing"] / calls * 1e6


def next_turn_start(turns: int = 5) -> dict[str, float]:
    """A chat's next turn: the n-gram drafter's start() on a conversation of every recorded
    prompt and answer, `turns` times over (about 20,000 tokens), after the turn before it."""
    sessions, _ = recorded_sessions()
    documents = [p + a for reqs in sessions.values() for p, a in reqs]
    before = [t for _ in range(turns) for document in documents for t in document]
    drafter = NgramDrafter()
    t0 = time.thread_time()
    drafter.start(before)
    first = time.thread_time() - t0
    t0 = time.thread_time()
    drafter.start(before + documents[0])
    return {"tokens": len(before), "first_start_ms": first * 1e3, "next_turn_start_ms": (time.thread_time() - t0) * 1e3}


def measure_replayed_drafters(repeats: int) -> dict[str, Any]:
    """The n-gram drafter's host time a step, with and without a memory, on recorded answers."""
    cases, n_vocab = replay_cases()
    loads = [os.getloadavg()[0]]
    records = {name: DrafterSteps(Clock()) for name in cases}
    for _ in range(repeats):  # interleaved, so drift in machine speed hits all alike
        for name, case in cases.items():
            undo = records[name].recording()
            try:
                for requests, memory in case:
                    replay_case(requests, memory(), n_vocab, records[name])
            finally:
                undo()
        loads.append(os.getloadavg()[0])
    return {
        "mode": "replay",
        "repeats": repeats,
        "timer_floor_cpu_us": timer_floor(),
        "start": next_turn_start(),
        "load_1min": [round(x, 2) for x in loads],
        "drafters": {name: record.summary() for name, record in records.items()},
    }


def session_prompts(session: str) -> list[str]:
    rows = [json.loads(line) for line in SESSIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = [row["prompt"] for row in rows if row["session"] == session]
    if not prompts:
        raise SystemExit(
            f"no session {session!r} in {SESSIONS.name}: pick one of {sorted({r['session'] for r in rows})}"
        )
    return prompts


def measure_drafters(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each drafter's host time a step in real requests: a session of related prompts, each
    drafter's runtime answering them in turn (the memory filling as it goes)."""
    target = load_backend("llamacpp", path, threads=args.threads)
    runtimes = {
        "none": runtime_for(target, strategy="none"),
        "n-gram": runtime_for(target, strategy="ngram"),
        "n-gram + memory": runtime_for(target, strategy="ngram", memory=NgramMemory()),
    }
    if args.draft:
        draft = load_backend("llamacpp", args.draft, threads=args.threads)
        runtimes["draft model"] = runtime_for(target, draft, strategy="draft")
    if target.capabilities.mtp_layers:  # the model's own MTP head, as `auto` drafts with it
        runtimes["MTP head"] = runtime_for(target, strategy="mtp")
    prompts = session_prompts(args.session)
    records = {name: DrafterSteps(Clock()) for name in runtimes}
    loads = [os.getloadavg()[0]]
    for name, runtime in runtimes.items():
        runtime.generate(prompts[0], max_tokens=8, temperature=0.0)  # warm-up: calibration, first touch
        record = records[name]
        undo = [instrument(record.clock, runtime, parts=False), record.recording()]
        undo += [record.watch(d, n) for d, n in ((runtime.drafter, "drafter"), (runtime.engine.lookup, "lookup")) if d]
        undo.append(record.watch_policy(runtime.policy))
        try:
            for _ in range(args.repeats):
                for prompt in prompts:
                    runtime.generate(
                        messages=[{"role": "user", "content": prompt}], max_tokens=args.tokens, temperature=0.0
                    )
        finally:
            for u in reversed(undo):
                u()
        loads.append(os.getloadavg()[0])
    info = target.info
    for runtime in runtimes.values():
        runtime.close()
    return {
        "mode": "runtime",
        "model": info.name,
        "draft": os.path.basename(args.draft) if args.draft else None,
        "session": args.session,
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "load_1min": [round(x, 2) for x in loads],
        "drafters": {name: record.summary() for name, record in records.items()},
    }


def print_drafters(r: dict[str, Any]) -> None:
    where = f"{r['model']}, session {r['session']}" if r["mode"] == "runtime" else "recorded sessions, replayed"
    print(f"# each drafter's host time a step ({where}), x{r['repeats']}, 1-minute load {r['load_1min']}")
    if "timer_floor_cpu_us" in r:
        print(f"# the timers' own CPU time in one timed call: {r['timer_floor_cpu_us']:.2f} us (included below)")
        st = r["start"]
        print(
            f"# n-gram start() on a {st['tokens']:,}-token conversation: {st['first_start_ms']:.2f} ms the first "
            f"time, {st['next_turn_start_ms']:.2f} ms at its next turn (CPU)"
        )
    print(f"{'drafter':<38} {'steps':>6} {'cpu us mean':>12} {'median':>8} {'p99':>8} {'wall us':>8} {'of Q4_1':>8}")
    for name, buckets in r["drafters"].items():
        for label, v in buckets.items():
            share = 100 * v["cpu_us_mean"] / Q4_1_STEP_US
            if label == "controller":  # the policy's calls, a step, guessing or not
                blank = " " * 26
                print(f"{name + ', the controller':<38} {'':>6} {v['cpu_us_mean']:>12.2f} {blank} {share:>7.2f}%")
                continue
            print(
                f"{name + ', ' + label:<38} {v['steps']:>6} {v['cpu_us_mean']:>12.2f} {v['cpu_us_median']:>8.2f} "
                f"{v['cpu_us_p99']:>8.2f} {v['wall_us_mean']:>8.2f} {share:>7.2f}%"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--random-vocab", type=int, help="write and time a random qwen35 model of this vocabulary")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", default="chat", choices=[p.id for p in SUITE])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--drafters", action="store_true", help="each drafter's host time a step, in real requests")
    ap.add_argument("--drafters-replay", action="store_true", help="n-gram and the memory's, replayed without a model")
    ap.add_argument("--draft", help="with --drafters: a draft model GGUF to time too")
    ap.add_argument("--session", default="product_yaml", help="with --drafters: the prompts_sessions.jsonl session")
    args = ap.parse_args()
    if args.drafters_replay:
        report = measure_replayed_drafters(args.repeats)
        print(json.dumps(report, indent=1)) if args.json else print_drafters(report)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = str(random_vocab_model(args.random_vocab, Path(tmp))) if args.random_vocab else args.model
        if path is None:
            ap.error("give MODEL.gguf or --random-vocab N")
        if args.drafters:
            report = measure_drafters(path, args)
            print(json.dumps(report, indent=1)) if args.json else print_drafters(report)
            return
        report = measure(path, args)
    print_report(report, args.json)


def measure(path: str, args: argparse.Namespace) -> dict[str, Any]:
    target = load_backend("llamacpp", path, threads=args.threads)
    runtime = runtime_for(target, strategy="none")
    messages = next(p for p in SUITE if p.id == args.prompt).messages
    text = render_chat(target.chat_template(), messages, target.special_texts())
    prompt = target.tokenize(text, add_special=False, parse_special=True)
    runtime.generate(prompt, max_tokens=8, temperature=0.0)  # warm-up: first-touch of the weights
    # Plain decoding as it runs on the CPU (the host's argmax over the logits row), the same with
    # the argmax in llama.cpp's graph (greedy.py, as where the output layer is on a GPU), and the
    # former with its parts timed.
    variants = {"device argmax": Clock(), "host argmax": Clock(), "parts": Clock()}
    totals = {name: [0, 0, 0.0, 0.0] for name in variants}  # steps, tokens, wall, cpu
    bares = {"bare loop": [0, 0, 0.0, 0.0, 0.0, 0.0], "bare loop in graph": [0, 0, 0.0, 0.0, 0.0, 0.0]}
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeats):  # interleaved, so drift in machine speed hits all alike
        for name, bare in bares.items():
            for i, v in enumerate(bare_loop(target, prompt, args.tokens, name == "bare loop in graph")):
                bare[i] += v
        for name, clock in variants.items():
            target._greedy.wanted = name == "device argmax"  # type: ignore[attr-defined]
            target._greedy.detach()  # type: ignore[attr-defined]
            runtime.generate(prompt, max_tokens=0)  # the prompt into the cache, untimed
            restore = instrument(clock, runtime, name == "parts")
            try:
                for i, v in enumerate(run_once(runtime, prompt, args.tokens, clock)):
                    totals[name][i] += v
            finally:
                restore()
        loads.append(os.getloadavg()[0])
    target._greedy.wanted = False  # type: ignore[attr-defined]
    info = target.info
    runtime.close()
    parts_steps = totals["parts"][0]
    report: dict[str, Any] = {
        "model": info.name,
        "n_vocab": info.n_vocab,
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "prompt_tokens": len(prompt),
        "load_1min": [round(x, 2) for x in loads],
        "parts_ms_per_step": {k: variants["parts"].wall[k] / parts_steps * 1e3 for k in PARTS},
        "parts_cpu_ms_per_step": {k: variants["parts"].cpu[k] / parts_steps * 1e3 for k in PARTS},
    }
    for name, (bare_n, bare_steps, bare_w, bare_c, bare_dw, bare_dc) in bares.items():
        report[name] = {
            "tokens_per_s": bare_n / bare_w,
            "host_ms_per_step": (bare_w - bare_dw) / bare_steps * 1e3,
            "host_cpu_ms_per_step": (bare_c - bare_dc) / bare_steps * 1e3,
            "decode_ms_per_step": bare_dw / bare_steps * 1e3,
        }
    for name in ("device argmax", "host argmax"):
        steps, tokens, wall, cpu = totals[name]
        clock = variants[name]
        report[name] = {
            "tokens_per_s": tokens / wall,
            "host_ms_per_step": (wall - clock.wall[DECODE]) / steps * 1e3,
            "host_cpu_ms_per_step": (cpu - clock.cpu[DECODE]) / steps * 1e3,
            "decode_ms_per_step": clock.wall[DECODE] / steps * 1e3,
        }
    return report


def print_report(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r, indent=1))
        return
    parts, cpu = r["parts_ms_per_step"], r["parts_cpu_ms_per_step"]
    host = sum(v for k, v in parts.items() if k != DECODE)
    host_cpu = sum(v for k, v in cpu.items() if k != DECODE)
    print(
        f"# {r['model']} (vocabulary {r['n_vocab']}), {r['threads']} thread(s), {r['tokens']} tokens x "
        f"{r['repeats']}, prompt {r['prompt_tokens']} tokens, 1-minute load {r['load_1min']}"
    )
    print(f"{'part of a plain step (own time, timers included)':<58} {'wall ms':>9} {'cpu ms':>9}")
    for name, label in PARTS.items():
        print(f"{label:<58} {parts[name]:>9.4f} {cpu[name]:>9.4f}")
    print(f"{'all but llama_decode':<58} {host:>9.4f} {host_cpu:>9.4f}")
    print()
    head = f"{'tok/s':>8} {'host wall ms':>13} {'host cpu ms':>12} {'decode ms':>10}"
    print(f"{'loop (untimed but for llama_decode)':<34} {head}")
    for name in ("bare loop", "bare loop in graph", "host argmax", "device argmax"):
        v = r[name]
        label = {
            "bare loop": "bare loop (llama_decode + argmax)",
            "bare loop in graph": "bare loop, the graph's argmax",
            "host argmax": "plain decoding (host argmax)",
            "device argmax": "plain, the graph's argmax",
        }[name]
        print(
            f"{label:<34} {v['tokens_per_s']:>8.1f} {v['host_ms_per_step']:>13.4f} "
            f"{v['host_cpu_ms_per_step']:>12.4f} {v['decode_ms_per_step']:>10.3f}"
        )


if __name__ == "__main__":
    main()
