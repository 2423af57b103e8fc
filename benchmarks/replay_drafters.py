"""Replays the bench suite's answers through the real engine, drafter and controller with a
simulated target: every verify pass "costs" the model's calibrated t_verify(k) on a
simulated clock, plus llama.cpp's graph rebuild (also calibrated) when its size differs
from the pass before, and the target's choice is the recorded answer. A drafter or controller
change can then be judged on every prompt in a second, without timing noise; the real bench
(`localspec bench`) confirms what this suggests.

    python benchmarks/replay_drafters.py MODEL.gguf [--tokens 160] [--fixed 4] [-t 0.8 --seeds 3]
        [--curve DOCTOR.json]

--curve prices the same answers on a cost curve that `localspec doctor --json` measured on
another machine: what the controller and the ceiling would make of them there.

--prior adds a column for a first run on a model never seen: the controller starts from the
prior (the roofline of this machine's, or the --curve report's, bandwidth and compute; no
calibration) and learns the curve from the simulated passes, which the curve prices.

The answers are recorded once per model (plain decoding, real llama.cpp) under
$LOCALSPEC_HOME/replay-<model>-....json. Greedy decoding is deterministic, so the replayed
acceptance equals a real run's; only the clock is simulated. With a temperature the answers
are sampled (one per seed) and the controller is told the request is sampled. The replay is
then exact in law: rejection sampling keeps an n-gram guess x with probability p(x), the same
law as "the target samples a token and the guess is kept if they agree", which is what the
replay does against a recorded sample of p.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import localspec.core.engine as engine_module
from localspec.api import load
from localspec.control.accelerators import Accelerator
from localspec.control.calibrate import Calibration, calibrated, prior_from
from localspec.control.config import DEFAULT
from localspec.control.costs import CostCurve
from localspec.control.factory import ngram_policy
from localspec.control.hardware import DeviceProbe, cpu_probe
from localspec.control.policy import AdaptiveDraftLength, FixedDraftLength
from localspec.control.prompts import BenchPrompt, load_prompt_sets
from localspec.core.backend_loader import load_backend
from localspec.core.engine import Engine
from localspec.core.protocol import Capabilities, DraftLengthPolicy, ModelInfo
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats, Step
from localspec.drafters import common_prefix
from localspec.drafters.ngram import NgramDrafter
from localspec.store import data_dir


class Clock:
    """Real time plus the simulated cost of every target pass."""

    def __init__(self) -> None:
        self.simulated = 0.0
        self._real = time.perf_counter  # the engine's `time` is this module: keep the real one

    def __call__(self) -> float:
        return self._real() + self.simulated


def rebuild_seconds(k: int, last: int, into_block: float, into_one: float) -> float:
    """What llama.cpp pays on top for a pass of k tokens after a pass of `last` tokens."""
    return 0.0 if k == last else (into_one if k == 1 else into_block)


@dataclass(frozen=True)
class Truth:
    """What a simulated pass costs: the calibrated curve (passes of one size in a row) plus
    the graph rebuild llama.cpp pays when a pass's size differs from the one before."""

    curve: CostCurve
    into_block: float = 0.0
    into_one: float = 0.0

    @classmethod
    def of(cls, calibration: Calibration) -> Truth:
        return cls(calibration.cost_curve(), calibration.rebuild_block_seconds, calibration.rebuild_one_seconds)

    def seconds(self, k: int, depth: int, last: int) -> float:
        """A pass of k tokens behind `depth` tokens, after a pass of `last` (0: a prefill)."""
        return self.curve.verify(k, depth) + rebuild_seconds(k, last, self.into_block, self.into_one)

    def plain(self, prompt: Sequence[int], answer: Sequence[int]) -> float:
        """Plain decoding of the answer: single-token passes, one rebuild after the prefill."""
        return sum(self.seconds(1, len(prompt) - 1 + i, 1 if i else 0) for i in range(len(answer)))


class ReplayTarget:
    """A target whose greedy choice at every position is the recorded answer's token."""

    def __init__(self, text: Sequence[int], truth: Truth, clock: Clock, n_vocab: int) -> None:
        self.text = list(text)
        self.truth = truth
        self.clock = clock
        self.last = 0  # the size of the pass before: the prefill's, for the first
        self.n_vocab = n_vocab
        self._tokens: list[int] = []
        self.info = ModelInfo("replay", "replay", "replay", "replay", 1 << 16, n_vocab, 0, 0, 0)
        self.capabilities = Capabilities(rollback=True, max_block=512, device="cpu")

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def end_of_generation(self) -> frozenset[int]:
        return frozenset()

    def rollback(self, n: int) -> None:
        del self._tokens[n:]

    def eval_block(self, tokens: Sequence[int], logits: str = "all") -> np.ndarray:
        past = len(self._tokens)
        self._tokens.extend(tokens)
        if logits != "all":
            return np.empty((0, self.n_vocab), dtype=np.float32)
        self.clock.simulated += self.truth.seconds(len(tokens), past, self.last)
        self.last = len(tokens)
        out = np.zeros((len(tokens), self.n_vocab), dtype=np.float32)
        for row in range(len(tokens)):
            nxt = past + row + 1
            out[row, self.text[nxt] if nxt < len(self.text) else 0] = 1.0
        return out


class Traced:
    """A policy that notes support, γ and accepted tokens of every step."""

    def __init__(self, inner: DraftLengthPolicy, sampled: bool = False) -> None:
        self.inner = inner
        self.sampled = sampled  # the recorded answer was sampled: the controller must know
        self.steps: list[tuple[int, int, int]] = []

    def would_draft(self, depth: int = 0) -> bool:
        return self.inner.would_draft(depth)

    def begin(self, sampled: bool) -> None:
        self.inner.begin(self.sampled)

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        gamma = self.inner.choose(limit, support, backlog, depth)
        self.steps.append((support, gamma, 0))
        return gamma

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        gamma, from_lookup = self.inner.choose_source(guessed, support, limit, backlog, depth)
        self.steps.append((support if from_lookup else 0, gamma, 0))
        return gamma, from_lookup

    def observe(self, step: Step) -> None:
        support, gamma, _ = self.steps[-1]
        self.steps[-1] = (support, gamma, step.accepted)
        self.inner.observe(step)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        self.inner.observe_shadow(drafted, accepted, support, start)


def record(
    model: str, tokens: int, path: Path, prompts: Sequence[BenchPrompt], temperature: float, seeds: int
) -> dict[str, object]:
    runtime = load(model=model, strategy="none")
    answers = {}
    for prompt in prompts:
        ids = runtime.prompt_tokens(messages=prompt.messages)
        for seed in range(seeds) if temperature > 0 else [None]:
            out = runtime.generate(messages=prompt.messages, max_tokens=tokens, temperature=temperature, seed=seed)
            key = prompt.id if seed is None else f"{prompt.id}#{seed}"
            answers[key] = {"prompt": ids, "answer": list(out.tokens)}
    data = {
        "calibration": calibrated(runtime.target).to_json(),
        "n_vocab": runtime.target.info.n_vocab,
        "answers": answers,
    }
    path.write_text(json.dumps(data))
    runtime.close()
    return data


def replay(
    prompt: list[int],
    answer: list[int],
    truth: Truth,
    n_vocab: int,
    policy: DraftLengthPolicy,
    trace: bool = False,
    sampled: bool = False,
) -> float:
    """Simulated seconds for the whole answer; trace prints support:drafted/accepted per step."""
    clock = Clock()
    target = ReplayTarget(prompt + answer, truth, clock, n_vocab)
    engine = Engine(target, NgramDrafter(), free_drafter=True)
    saved = engine_module.time.perf_counter
    engine_module.time.perf_counter = clock  # type: ignore[assignment]
    try:
        stats = Stats()
        produced = []
        cfg = SamplingConfig(temperature=0.0)
        traced = Traced(policy, sampled)
        for step in engine.generate(prompt, len(answer), cfg, traced, stats, np.random.default_rng(0)):
            produced.extend(step.tokens)
    finally:
        engine_module.time.perf_counter = saved  # type: ignore[assignment]
    assert produced == answer, "the replay diverged from the recorded answer"
    if trace:
        print(" ".join(f"{s}:{g}/{a}" for s, g, a in traced.steps))
    return stats.decode_seconds


class LookupCache:
    """llama-lookup's drafter as its source reads (common/ngram-cache.cpp), for comparison:
    counts of what followed every 1- to 4-gram; a draft extends token by token with the most
    frequent follower of the longest n-gram whose counts pass its "lax" thresholds."""

    MIN_SAMPLES = (2, 2, 1, 1)  # per n-gram size 1..4
    MIN_PERCENT = (66, 50, 50, 50)

    def __init__(self, tokens: Sequence[int]) -> None:
        self.counts: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
        self.tokens: list[int] = []
        self.add(tokens)

    def add(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n in range(1, 5):
                if end - n >= 0:
                    self.counts[tuple(self.tokens[end - n : end])][token] += 1

    def draft(self, n_draft: int) -> list[int]:
        out: list[int] = []
        while len(out) < n_draft:
            text = self.tokens + out
            guess = None
            for n in range(4, 0, -1):
                followers = self.counts.get(tuple(text[-n:])) if len(text) >= n else None
                if not followers:
                    continue
                total = sum(followers.values())
                token, count = followers.most_common(1)[0]
                if total >= self.MIN_SAMPLES[n - 1] and 100 * count >= self.MIN_PERCENT[n - 1] * total:
                    guess = token
                    break
            if guess is None:
                break
            out.append(guess)
        return out


def replay_lookup(prompt: list[int], answer: list[int], truth: Truth, n_draft: int) -> float:
    """Simulated seconds of llama-lookup's loop (a fixed draft of up to n_draft tokens)."""
    cache, done, seconds, last = LookupCache(prompt), 0, 0.0, 0
    while done < len(answer):
        guess = cache.draft(min(n_draft, len(answer) - done - 1))
        accepted = common_prefix(guess, answer[done:])
        seconds += truth.seconds(len(guess) + 1, len(prompt) - 1 + done, last)
        last = len(guess) + 1
        cache.add(answer[done : done + accepted + 1])
        done += accepted + 1
    return seconds


def ceiling(prompt: list[int], answer: list[int], truth: Truth, guesses: Sequence[Sequence[int]]) -> float:
    """Least simulated seconds any draft-length choice could reach with these guesses (one
    per position): dynamic programming over the answer and the size of the pass before (a
    rebuild depends on it), drafting only what comes true."""
    n = len(answer)
    rights = [min(common_prefix(guesses[i], answer[i:]), n - 1 - i) for i in range(n)]
    sizes = range(max(rights, default=0) + 2)  # 0: the prefill before the first pass
    # best[i][last]: least seconds from position i on when the pass before had `last` tokens.
    best = [[0.0] * len(sizes) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        depth = len(prompt) - 1 + i
        for last in sizes:
            best[i][last] = min(
                truth.seconds(g + 1, depth, last) + best[i + g + 1][g + 1] for g in range(rights[i] + 1)
            )
    return best[0][0]


def from_doctor(path: Path) -> Calibration:
    """The calibration a `localspec doctor --json` printed, on whatever machine it ran: the
    recorded answers can then be priced on that machine's curve. Rebuilds count as zero where
    the report predates their measurement."""
    report = json.loads(path.read_text())
    rebuild = report.get("rebuild_ms") or {}
    deep = report.get("verify_ms_deep")
    return Calibration(
        [t / 1e3 for t in report["verify_ms"]],
        report["verify_ms"][0] / 1e3,
        [t / 1e3 for t in deep] if deep else None,
        report.get("deep_depth") or 512,
        rebuild.get("into_block", 0.0) / 1e3,
        rebuild.get("into_one", 0.0) / 1e3,
    )


def prior_for(model: str, doctor: Path | None) -> Calibration:
    """The prior a first run of `model` starts from, on this machine or the doctor report's."""
    backend = load_backend("llamacpp", model)
    size, params = backend.info.size_bytes, backend.info.n_params
    backend.close()
    device = cpu_probe()
    if doctor is not None:
        found = json.loads(doctor.read_text())["device"]
        found["simd"] = tuple(found["simd"])
        found["accelerators"] = tuple(Accelerator(**a) for a in found["accelerators"])
        device = DeviceProbe(**found)
    return prior_from(device, size, params)


def adaptive(curve: CostCurve) -> AdaptiveDraftLength:
    """The controller as the runtime builds it for n-gram drafting."""
    return ngram_policy(curve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--trace", action="store_true", help="print support:drafted/accepted per step")
    parser.add_argument("--fixed", type=int, action="append", default=[], help="also replay a fixed draft length")
    parser.add_argument(
        "--prompts", action="append", help="'suite' or a JSONL file as `localspec bench --prompts` takes; repeatable"
    )
    parser.add_argument("-t", "--temperature", type=float, default=0.0, help="replay sampled answers")
    parser.add_argument("--seeds", type=int, default=3, help="sampled answers per prompt (with -t)")
    parser.add_argument(
        "--curve", type=Path, help="price the passes on this `localspec doctor --json` report (another machine's)"
    )
    parser.add_argument("--prior", action="store_true", help="add a first run from the prior, without calibration")
    args = parser.parse_args()
    sources = args.prompts or ["suite"]
    suite = "+".join(Path(source).stem for source in sources)
    sampled = args.temperature > 0
    kind = f"-t{args.temperature:g}x{args.seeds}" if sampled else ""
    path = data_dir() / f"replay-{Path(args.model).name}-{suite}-{args.tokens}{kind}.json"
    if path.exists():
        data = json.loads(path.read_text())
    else:
        prompts = load_prompt_sets(sources)
        data = record(args.model, args.tokens, path, prompts, args.temperature, args.seeds)
    loaded = from_doctor(args.curve) if args.curve else Calibration.from_json(data["calibration"])
    if loaded is None:
        raise SystemExit(f"{path} was recorded by an older localspec: delete it to record the answers again")
    calibration = loaded
    cal = calibration.to_json()
    print(
        f"graph rebuild (ms): into a block {calibration.rebuild_block_seconds * 1e3:.2f}, "
        f"into one token {calibration.rebuild_one_seconds * 1e3:.2f}"
    )
    for name, values in (("curve", cal["verify_seconds"]), ("deep curve", cal["deep_verify_seconds"] or [])):
        print(f"{name} (ms): {' '.join(f'{t * 1e3:.1f}' for t in values)}")
    # On sampled answers, also the controller as if the requests were greedy (its greedy
    # priors and tables): what the separate sampled tables change.
    prior = prior_for(args.model, args.curve) if args.prior else None
    columns = ["localspec", *(["greedy priors"] if sampled else []), "no depth", *(["from prior"] if prior else [])]
    columns += [*(f"fixed {g}" for g in args.fixed), "lookup 4", "lookup 8", "ceiling", f"ceiling ≤{DEFAULT.max_draft}"]
    columns += ["lookup ceiling"]
    print(
        "speedup over plain decoding, simulated clock; ceiling: the best any draft length could do "
        f"(drafts of up to 64 tokens, or up to the runtime's {DEFAULT.max_draft})"
    )
    print(f"| prompt | {' | '.join(columns)} |")
    print(f"|---|{'---|' * len(columns)}")
    totals = [0.0] * (len(columns) + 1)
    losses = [0] * len(columns)
    for pid, rec in data["answers"].items():
        prompt, answer = rec["prompt"], rec["answer"]
        truth = Truth.of(calibration)
        plain = truth.plain(prompt, answer)

        policies: list[tuple[DraftLengthPolicy, bool]] = [
            (adaptive(calibration.cost_curve()), sampled),
            *([(adaptive(calibration.cost_curve()), False)] if sampled else []),
            (adaptive(CostCurve(list(cal["verify_seconds"]))), sampled),
            *([(adaptive(prior.cost_curve()), sampled)] if prior else []),
            *((FixedDraftLength(g), sampled) for g in args.fixed),
        ]
        seconds = [
            replay(prompt, answer, truth, data["n_vocab"], policy, args.trace, kind) for policy, kind in policies
        ]
        seconds += [replay_lookup(prompt, answer, truth, n) for n in (4, 8)]
        ours, theirs = NgramDrafter(), []
        ours.start(prompt)
        text = prompt + answer
        cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
        guesses = [ours.propose(text[: len(prompt) + i], 64, cfg, rng).tokens for i in range(len(answer))]
        theirs = [LookupCache(text[: len(prompt) + i]).draft(64) for i in range(len(answer))]
        # The runtime drafts at most max_draft tokens (its calibration stops at 16-token
        # passes); the uncapped ceiling prices longer passes on the curve's extension.
        capped = [guess[: DEFAULT.max_draft] for guess in guesses]
        seconds += [ceiling(prompt, answer, truth, g) for g in (guesses, capped, theirs)]
        print(f"| {pid} | {' | '.join(f'{plain / t:.2f}x' for t in seconds)} |")
        totals = [a + b for a, b in zip(totals, [plain, *seconds], strict=True)]
        losses = [n + (plain / t < 0.98) for n, t in zip(losses, seconds, strict=True)]
    print(f"| all (total time) | {' | '.join(f'{totals[0] / t:.2f}x' for t in totals[1:])} |")
    print(f"| answers below 0.98x | {' | '.join(str(n) for n in losses)} |")


if __name__ == "__main__":
    main()
