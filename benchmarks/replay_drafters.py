"""Replays the bench suite's greedy answers through the real engine, drafter and controller
with a simulated target: every verify pass "costs" the model's calibrated t_verify(k) on a
simulated clock, and the target's choice is the recorded greedy answer. A drafter or
controller change can then be judged on every prompt in a second, without timing noise;
the real bench (`localspec bench`) confirms what this suggests.

    python benchmarks/replay_drafters.py MODEL.gguf [--tokens 160] [--fixed 4]

The answers are recorded once per model (plain greedy decoding, real llama.cpp) under
$LOCALSPEC_HOME/replay-<model>.json. Greedy decoding is deterministic, so the replayed
acceptance equals a real run's; only the clock is simulated.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import localspec.engine as engine_module
from localspec.api import MAX_DRAFT, NGRAM_SECONDS_PER_TOKEN, load
from localspec.calibrate import Calibration, calibrated
from localspec.controller import AdaptiveDraftLength, CostCurve, DraftLengthPolicy, FixedDraftLength, StepOutcome
from localspec.drafters.ngram import NgramDrafter
from localspec.engine import Engine
from localspec.paths import data_dir
from localspec.prompts import SUITE
from localspec.protocol import Capabilities, ModelInfo
from localspec.sampling import SamplingConfig
from localspec.stats import Stats


class Clock:
    """Real time plus the simulated cost of every target pass."""

    def __init__(self) -> None:
        self.simulated = 0.0
        self._real = time.perf_counter  # the engine's `time` is this module: keep the real one

    def __call__(self) -> float:
        return self._real() + self.simulated


class ReplayTarget:
    """A target whose greedy choice at every position is the recorded answer's token."""

    def __init__(self, text: Sequence[int], curve: CostCurve, clock: Clock, n_vocab: int) -> None:
        self.text = list(text)
        self.curve = curve
        self.clock = clock
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
        self.clock.simulated += self.curve.verify(len(tokens), past)
        out = np.zeros((len(tokens), self.n_vocab), dtype=np.float32)
        for row in range(len(tokens)):
            nxt = past + row + 1
            out[row, self.text[nxt] if nxt < len(self.text) else 0] = 1.0
        return out


class Traced:
    """A policy that notes support, γ and accepted tokens of every step."""

    def __init__(self, inner: DraftLengthPolicy) -> None:
        self.inner = inner
        self.steps: list[tuple[int, int, int]] = []

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        gamma = self.inner.choose(limit, support, backlog, depth)
        self.steps.append((support, gamma, 0))
        return gamma

    def observe(self, step: StepOutcome) -> None:
        support, gamma, _ = self.steps[-1]
        self.steps[-1] = (support, gamma, step.accepted)
        self.inner.observe(step)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        self.inner.observe_shadow(drafted, accepted, support, start)


def record(model: str, tokens: int, path: Path) -> dict[str, object]:
    runtime = load(model=model, strategy="none")
    answers = {}
    for prompt in SUITE:
        ids = runtime.prompt_tokens(messages=prompt.messages)
        out = runtime.generate(messages=prompt.messages, max_tokens=tokens, temperature=0)
        answers[prompt.id] = {"prompt": ids, "answer": list(out.tokens)}
    data = {
        "calibration": calibrated(runtime.target).to_json(),
        "n_vocab": runtime.target.info.n_vocab,
        "answers": answers,
    }
    path.write_text(json.dumps(data))
    runtime.close()
    return data


def replay(
    prompt: list[int], answer: list[int], curve: CostCurve, n_vocab: int, policy: DraftLengthPolicy, trace: bool = False
) -> float:
    """Simulated seconds for the whole answer; trace prints support:drafted/accepted per step."""
    clock = Clock()
    target = ReplayTarget(prompt + answer, curve, clock, n_vocab)
    engine = Engine(target, NgramDrafter(), free_drafter=True)
    saved = engine_module.time.perf_counter
    engine_module.time.perf_counter = clock  # type: ignore[assignment]
    try:
        stats = Stats()
        produced = []
        cfg = SamplingConfig(temperature=0.0)
        traced = Traced(policy)
        for step in engine.generate(prompt, len(answer), cfg, traced, stats, np.random.default_rng(0)):
            produced.extend(step.tokens)
    finally:
        engine_module.time.perf_counter = saved  # type: ignore[assignment]
    assert produced == answer, "the replay diverged from the recorded answer"
    if trace:
        print(" ".join(f"{s}:{g}/{a}" for s, g, a in traced.steps))
    return stats.decode_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--trace", action="store_true", help="print support:drafted/accepted per step")
    parser.add_argument("--fixed", type=int, action="append", default=[], help="also replay a fixed draft length")
    args = parser.parse_args()
    path = data_dir() / f"replay2-{Path(args.model).name}-{args.tokens}.json"
    data = json.loads(path.read_text()) if path.exists() else record(args.model, args.tokens, path)
    cal = data["calibration"]
    calibration = Calibration(
        cal["verify_seconds"], cal["decode_seconds"], cal["deep_verify_seconds"], cal["deep_depth"]
    )
    for name, values in (("curve", cal["verify_seconds"]), ("deep curve", cal["deep_verify_seconds"] or [])):
        print(f"{name} (ms): {' '.join(f'{t * 1e3:.1f}' for t in values)}")
    print(f"{'prompt':12} {'policy':10} {'speedup':>8}")
    for pid, rec in data["answers"].items():
        truth = calibration.cost_curve()
        start = len(rec["prompt"]) - 1
        plain = sum(truth.verify(1, start + i) for i in range(len(rec["answer"])))
        policies: list[tuple[str, DraftLengthPolicy]] = [
            ("adaptive", AdaptiveDraftLength(calibration.cost_curve(), NGRAM_SECONDS_PER_TOKEN, max_gamma=MAX_DRAFT)),
            (
                "no depth",
                AdaptiveDraftLength(
                    CostCurve(list(cal["verify_seconds"])), NGRAM_SECONDS_PER_TOKEN, max_gamma=MAX_DRAFT
                ),
            ),
        ]
        policies += [(f"fixed {g}", FixedDraftLength(g)) for g in args.fixed]
        for name, policy in policies:
            seconds = replay(rec["prompt"], rec["answer"], truth, data["n_vocab"], policy, args.trace)
            print(f"{pid:12} {name:10} {plain / seconds:7.2f}x")


if __name__ == "__main__":
    main()
