"""Recorded answers replayed through the real engine, n-gram drafter and policy against a
simulated target on a simulated clock: every verify pass "costs" what a fixed cost curve says
(plus llama.cpp's graph rebuild when its size differs from the pass before), and the target's
choice is the recorded answer's token. A controller change is then judged on every prompt
and every machine's curve in a second, without timing noise (benchmarks/replay_drafters.py;
the golden replays in tests/specification/test_controller_replays.py).

A draft model at a constant acceptance on a measured curve (a GPU's, say) is projected the
same way, without answers: constant_acceptance, and projection_rows for the benchmarks' tables.

Greedy answers only: the engine accepts a guess where it equals the recorded token, which is
what the real target would have chosen, so the replayed acceptance equals a real run's.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from localspec.control.calibrate import Calibration
from localspec.control.config import DEFAULT
from localspec.control.costs import CostCurve
from localspec.control.factory import model_policy, ngram_policy
from localspec.core.engine import Engine
from localspec.core.protocol import Backend, Capabilities, Decision, DraftLengthPolicy, DraftPrices, ModelInfo
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats, Step
from localspec.drafters import common_prefix
from localspec.drafters.memory import NgramMemory
from localspec.drafters.ngram import NgramDrafter


class Clock:
    """The simulated cost of every target pass; with `real`, real time on top (the drafter's
    and the engine's own Python), else nothing else moves it, so a replay is deterministic."""

    def __init__(self, real: bool = False) -> None:
        self.simulated = 0.0
        self._real: Callable[[], float] = time.perf_counter if real else (lambda: 0.0)

    def __call__(self) -> float:
        return self._real() + self.simulated


def rebuild_seconds(k: int, last: int, into_block: float, into_one: float) -> float:
    """What llama.cpp pays on top for a pass of k tokens after a pass of `last` tokens."""
    return 0.0 if k == last else (into_one if k == 1 else into_block)


@dataclass(frozen=True)
class Truth:
    """What a simulated pass costs: a fixed curve (passes of one size in a row) plus the graph
    rebuild llama.cpp pays when a pass's size differs from the one before."""

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
        self.capabilities = Capabilities(max_block=512, device="cpu")

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
        self.decisions: list[Decision | None] = []  # what decided each step's γ (explain)

    def would_draft(self, depth: int = 0) -> bool:
        return self.inner.would_draft(depth)

    def would_guess(self, guessed: int, support: int, depth: int = 0) -> bool:
        return self.inner.would_guess(guessed, support, depth)

    def begin(self, sampled: bool) -> None:
        self.inner.begin(self.sampled)

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        gamma = self.inner.choose(limit, support, backlog, depth)
        self.steps.append((support, gamma, 0))
        self.decisions.append(self.inner.explain())
        return gamma

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        gamma, from_lookup = self.inner.choose_source(guessed, support, limit, backlog, depth)
        self.steps.append((support if from_lookup else 0, gamma, 0))
        self.decisions.append(self.inner.explain())
        return gamma, from_lookup

    def explain(self) -> Decision | None:
        return self.inner.explain()

    def prices(self) -> DraftPrices | None:
        return self.inner.prices()

    def observe(self, step: Step) -> None:
        support, gamma, _ = self.steps[-1]
        self.steps[-1] = (support, gamma, step.accepted)
        self.inner.observe(step)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        self.inner.observe_shadow(drafted, accepted, support, start)


def replay(
    prompt: list[int],
    answer: list[int],
    truth: Truth,
    n_vocab: int,
    policy: DraftLengthPolicy,
    trace: bool = False,
    sampled: bool = False,
    real_time: bool = False,
    drafter: NgramDrafter | None = None,
) -> float:
    """Simulated seconds to decode the whole answer with n-gram drafting under `policy`
    (`drafter`: one with a memory of earlier requests); trace prints support:drafted/accepted
    per step."""
    clock = Clock(real_time)
    target = ReplayTarget(prompt + answer, truth, clock, n_vocab)
    # The engine reads only the methods ReplayTarget has (its loop, not the whole protocol).
    engine = Engine(cast(Backend, target), drafter or NgramDrafter(), free_drafter=True, clock=clock)
    stats, produced, traced = Stats(), list[int](), Traced(policy, sampled)
    cfg = SamplingConfig(temperature=0.0)
    for step in engine.generate(prompt, len(answer), cfg, traced, stats, np.random.default_rng(0)):
        produced.extend(step.tokens)
    if produced != answer:
        raise AssertionError("the replay diverged from the recorded answer")
    if trace:
        print(" ".join(f"{s}:{g}/{a}" for s, g, a in traced.steps))
        adjusted = Counter(d.adjustment for d in traced.decisions if d is not None and d.adjustment)
        for why, n in adjusted.most_common():
            print(f"{n} steps: {why}")
    return stats.decode_seconds


def ngram_guesses(prompt: list[int], answer: list[int], longest: int) -> list[list[int]]:
    """The n-gram drafter's guess of up to `longest` tokens at every position of the answer."""
    drafter = NgramDrafter()
    drafter.start(prompt)
    text = prompt + answer
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    return [list(drafter.propose(text[: len(prompt) + i], longest, cfg, rng).tokens) for i in range(len(answer))]


def replay_fixed(
    prompt: list[int], answer: list[int], truth: Truth, guesses: Sequence[Sequence[int]], gamma: int
) -> float:
    """Simulated seconds of a fixed draft length γ on these guesses (one per position): each
    step drafts what the guess offers, up to γ and what is left of the answer."""
    done, seconds, last = 0, 0.0, 0
    while done < len(answer):
        guess = guesses[done][: min(gamma, len(answer) - done - 1)]
        accepted = common_prefix(guess, answer[done:])
        seconds += truth.seconds(len(guess) + 1, len(prompt) - 1 + done, last)
        last = len(guess) + 1
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
        # A pass of g+1 tokens here, then the best from where it leaves off; a rebuild on top
        # unless the pass before had the same size.
        onward = [truth.curve.verify(g + 1, depth) + best[i + g + 1][g + 1] for g in range(rights[i] + 1)]
        rebuilt = min(t + rebuild_seconds(g + 1, -1, truth.into_block, truth.into_one) for g, t in enumerate(onward))
        for last in sizes:
            best[i][last] = min(rebuilt, onward[last - 1]) if 0 < last <= len(onward) else rebuilt
    return best[0][0]


class LookupCache:
    """llama-lookup's drafter as its source reads (common/ngram-cache.cpp), for comparison:
    counts of what followed every 1- to 4-gram; a draft extends token by token with the most
    frequent follower of the longest n-gram whose counts pass its "lax" thresholds, and, given
    a dynamic cache (`-lcd`: the counts of earlier runs' texts), of the longest whose counts
    there pass its "strict" ones."""

    MIN_SAMPLES = (2, 2, 1, 1)  # per n-gram size 1..4
    MIN_PERCENT = (66, 50, 50, 50)
    STRICT_SAMPLES = (4, 3, 2, 2)
    STRICT_PERCENT = (75, 66, 66, 66)

    def __init__(self, tokens: Sequence[int], dynamic: LookupCache | None = None) -> None:
        self.counts: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
        self.tokens: list[int] = []
        self.dynamic = dynamic
        self.add(tokens)

    def add(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n in range(1, 5):
                if end - n >= 0:
                    self.counts[tuple(self.tokens[end - n : end])][token] += 1

    def merge(self, other: LookupCache) -> None:
        """Take another run's counts (llama-lookup saving its context into the dynamic cache)."""
        for key, followers in other.counts.items():
            self.counts[key].update(followers)

    def follower(self, text: Sequence[int], samples: Sequence[int], percent: Sequence[int]) -> int | None:
        for n in range(4, 0, -1):
            followers = self.counts.get(tuple(text[-n:])) if len(text) >= n else None
            if not followers:
                continue
            total = sum(followers.values())
            token, count = followers.most_common(1)[0]
            if total >= samples[n - 1] and 100 * count >= percent[n - 1] * total:
                return token
        return None

    def draft(self, n_draft: int) -> list[int]:
        out: list[int] = []
        while len(out) < n_draft:
            text = self.tokens + out
            guess = self.follower(text, self.MIN_SAMPLES, self.MIN_PERCENT)
            if guess is None and self.dynamic is not None:
                guess = self.dynamic.follower(text, self.STRICT_SAMPLES, self.STRICT_PERCENT)
            if guess is None:
                break
            out.append(guess)
        return out


def lookup_passes(
    prompt: list[int], answer: list[int], n_draft: int, dynamic: LookupCache | None = None
) -> Iterator[tuple[int, int]]:
    """llama-lookup's passes over the answer (examples/lookup/lookup.cpp), as (drafted, kept):
    the prompt's last token goes alone and gives the first token, then each pass drafts up to
    n_draft tokens (no more than the answer has left) and keeps the prefix the answer agrees
    with, and the token after it. With `dynamic`, its -lcd cache, which takes this run's
    counts at the end as llama-lookup saves it. benchmarks/lookup_fidelity.py checks these
    passes against the program's own counts (tests/data/lookup_counts.json)."""
    cache, done = LookupCache(prompt, dynamic), 0
    while done < len(answer):
        guess = cache.draft(min(n_draft, len(answer) - done - 1)) if done else []
        accepted = common_prefix(guess, answer[done:])
        yield len(guess), accepted
        cache.add(answer[done : done + accepted + 1])
        done += accepted + 1
    if dynamic is not None:
        dynamic.merge(cache)


# Stands for an answer's end of text, which recorded answers leave out: no draft guesses it.
END_OF_TEXT = -1


def lookup_timed_passes(prompt: list[int], answer: list[int], n_draft: int, ended: bool) -> list[tuple[int, int]]:
    """The passes llama-lookup times and counts (its decode after the first token, which the
    prompt's pass gives), as lookup_passes; ended: the answer ended in an end of text, a token
    llama-lookup decodes and counts too."""
    return list(lookup_passes(prompt, [*answer, END_OF_TEXT] if ended else answer, n_draft))[1:]


def replay_lookup(
    prompt: list[int], answer: list[int], truth: Truth, n_draft: int, dynamic: LookupCache | None = None
) -> float:
    """Simulated seconds of llama-lookup's loop (lookup_passes), every pass timed as the
    replays time ours, the first one's too."""
    seconds, done, last = 0.0, 0, 0
    for drafted, accepted in lookup_passes(prompt, answer, n_draft, dynamic):
        seconds += truth.seconds(drafted + 1, len(prompt) - 1 + done, last)
        last = drafted + 1
        done += accepted + 1
    return seconds


def replay_session(
    requests: Sequence[Mapping[str, Sequence[int]]],
    cal: Calibration,
    n_vocab: int,
    gammas: Sequence[int] = (4, 8),
    start: Calibration | None = None,
) -> dict[str, float]:
    """A session of related requests (benchmarks/memory_replay.py) replayed in order: simulated
    seconds per column (plain, n-gram with and without the memory of the session's earlier
    requests, llama-lookup at each γ with and without its -lcd cache) over every request but
    the first, which nothing can be recalled for. One policy per column, as one runtime serves
    a session; `start`: the curve its policies start from (a learnt one), else the truth's."""
    truth, begin = Truth.of(cal), start or cal
    # A curve of its own per policy: a policy learns its curve as it goes, the truth must not.
    policies = {"ngram": ngram_policy(begin.cost_curve()), "ngram+memory": ngram_policy(begin.cost_curve())}
    memory = NgramMemory()
    dynamic = {g: LookupCache([]) for g in gammas}
    seconds: dict[str, float] = {}
    for i, rec in enumerate(requests):
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        columns = {
            "plain": truth.plain(prompt, answer),
            "ngram": replay(prompt, answer, truth, n_vocab, policies["ngram"]),
            "ngram+memory": replay(
                prompt, answer, truth, n_vocab, policies["ngram+memory"], drafter=NgramDrafter(memory=memory)
            ),
        }
        for g in gammas:
            columns[f"lookup γ={g}"] = replay_lookup(prompt, answer, truth, g)
            columns[f"lookup γ={g} -lcd"] = replay_lookup(prompt, answer, truth, g, dynamic[g])
        memory.add(prompt + answer)
        if i > 0:
            for column, s in columns.items():
                seconds[column] = seconds.get(column, 0.0) + s
    return seconds


def learnt_calibration(path: Path, match: str = "") -> Calibration:
    """The first learnt curve in a calibration cache file (LOCALSPEC_HOME's calibration.json)
    whose key contains `match`: what a runtime on that machine starts from."""
    for key, entry in json.loads(path.read_text(encoding="utf-8")).items():
        cal = Calibration.from_json(entry) if key.startswith("learnt|") and match in key else None
        if cal is not None:
            return cal
    raise ValueError(f"{path} holds no learnt curve whose key contains {match!r}")


def calibration_from_doctor(report: Mapping[str, Any]) -> Calibration:
    """The calibration a `localspec doctor --json` report (or a curve saved in its form)
    holds, on whatever machine it ran; rebuilds count as zero where it has none."""
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


@dataclass(frozen=True)
class Score:
    """Simulated seconds over a set of answers, summed: plain decoding, the adaptive policy,
    each fixed γ (fixed[γ-1]), the best fixed γ chosen per answer, and the ceiling of drafts
    up to max_draft tokens; worst: the adaptive policy's lowest speedup on one answer."""

    plain: float
    adaptive: float
    fixed: tuple[float, ...]
    best_fixed_per_answer: float
    ceiling: float
    worst: float

    def speedup(self, seconds: float) -> float:
        return self.plain / seconds


def score(
    answers: Mapping[str, Mapping[str, list[int]]],
    truth: Truth,
    n_vocab: int,
    policy: Callable[[], DraftLengthPolicy],
    max_fixed: int = 8,
    max_draft: int = DEFAULT.max_draft,
) -> Score:
    """Every answer replayed with a fresh policy(), beside the fixed lengths and the ceiling."""
    plain = adaptive = best = top = 0.0
    fixed = [0.0] * max_fixed
    worst = float("inf")
    for rec in answers.values():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        base = truth.plain(prompt, answer)
        ours = replay(prompt, answer, truth, n_vocab, policy())
        guesses = ngram_guesses(prompt, answer, max_draft)
        each = [replay_fixed(prompt, answer, truth, guesses, g) for g in range(1, max_fixed + 1)]
        plain, adaptive, best = plain + base, adaptive + ours, best + min(base, *each)
        top += ceiling(prompt, answer, truth, guesses)
        fixed = [a + b for a, b in zip(fixed, each, strict=True)]
        worst = min(worst, base / ours)
    return Score(plain, adaptive, tuple(fixed), best, top, worst)


def expected_tokens(gamma: int, alpha: float) -> float:
    return sum(alpha**j for j in range(gamma + 1))


def fixed_speedup(target: Sequence[float], draft: float, gamma: int, alpha: float) -> float:
    """Tokens per second over plain decoding's of a fixed γ, every drafted token kept with
    chance alpha; target[k-1] is the cost of a pass over k tokens, draft of a drafted token."""
    cost = gamma * draft + (target[gamma] if gamma < len(target) else target[-1])
    return expected_tokens(gamma, alpha) * target[0] / cost


def constant_acceptance(target: Sequence[float], draft: float, alpha: float, steps: int = 600) -> tuple[int, float]:
    """The adaptive policy a runtime builds for a draft model (its load-time agreement is
    alpha) over simulated steps at this acceptance: the γ it settles on (the most chosen in the
    second half) and the speedup its own choices there give, each step's expected tokens over
    its cost, so the acceptance draws move only the choices, not the figure."""
    policy = model_policy(CostCurve(list(target)), draft, alpha)
    rng = np.random.default_rng(0)
    chosen: Counter[int] = Counter()
    tokens = seconds = 0.0
    for i in range(steps):
        gamma = policy.choose(len(target) - 1)
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        policy.observe(Step(gamma, accepted, gamma * draft, target[gamma]))
        if i >= steps // 2:
            chosen[gamma] += 1
            tokens += expected_tokens(gamma, alpha)
            seconds += gamma * draft + target[gamma]
    return chosen.most_common(1)[0][0], tokens / seconds * target[0]


def projection_rows(
    target: list[float], draft: float, alphas: tuple[float, ...]
) -> list[tuple[float, int, float, int, float]]:
    """What a drafter would add on measured pass costs, per acceptance: (alpha, best fixed γ,
    its speedup, the γ the controller settles on, the speedup of its choices)."""
    rows = []
    for alpha in alphas:
        fixed = {g: fixed_speedup(target, draft, g, alpha) for g in range(len(target))}
        best = max(fixed, key=lambda g: fixed[g])
        chosen, reached = constant_acceptance(target, draft, alpha)
        rows.append((alpha, best, fixed[best], chosen, reached))
    return rows
