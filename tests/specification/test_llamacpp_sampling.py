"""Speculative sampling on llama.cpp draws the first two tokens from the target's own
distribution, whatever the drafter proposes.

The exact law of (t1, t2) is computed from the target: p(t1) from the logits after the
prompt, p(t2 | t1) from the logits after prompt + t1, both shaped by the same sampler
chain (`process`) and SamplingConfig the engine uses. A chi-square test then compares it
with the tokens that speculative runs (fixed seeds, so the test is reproducible) produce.

Each drafter's law is checked on a tiny random llama written by gguf_writer (one thread,
about 1 ms a run) whose drafter is its weights perturbed, so drafts are both kept whole and
cut; the real SmolLM2-135M keeps one run with a draft model, its real vocabulary and
sampler chain included.

Approximation: the engine gets these logits from verify blocks of 2-3 tokens, and after a
rejection from a second block whose first position was cached by the first one. On this
llama.cpp build every block under 64 tokens gives bit-identical rows, so the exact
law below is computed from 2-token blocks over the same one-block prefill the engine uses;
any residual rounding is orders of magnitude below what a few thousand samples can see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from scipy.stats import chisquare
from sources import AlternatingSources, alternating_runtime

from localspec.api import Finished, Runtime, derive_drafter, runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.protocol import Backend, eval_chunked
from localspec.core.sampling import SamplingConfig, process
from localspec.testing.gguf_writer import Spec, write_gguf

pytestmark = pytest.mark.model

# top_k = 8 keeps the joint law to 64 cells; top_p and min_p off so only top-k truncates.
SAMPLING: dict[str, Any] = {"temperature": 1.0, "top_k": 8, "top_p": 1.0, "min_p": 0.0}
MIN_EXPECTED = 5.0  # chi-square cells expecting fewer samples are pooled
P_FLOOR = 1e-3
END = -1  # any end-of-generation token: the engine emits none of them

Pair = tuple[int, ...]


def exact_first_two(target: Backend, prompt: Sequence[int], cfg: SamplingConfig) -> dict[Pair, float]:
    """P(t1, t2) for plain sampling from the target; a turn that ends early is (END,) or (t1, END)."""
    eog = target.end_of_generation()
    target.rollback(0)
    eval_chunked(target, list(prompt[:-1]), "none")  # in max_block's blocks, like the engine's prefill
    first = process(target.eval_block([prompt[-1]], "all")[-1].copy(), cfg)
    law: dict[Pair, float] = {}
    for t1, p1 in zip(first.ids.tolist(), first.probs.tolist(), strict=True):
        if t1 in eog:
            law[(END,)] = law.get((END,), 0.0) + p1
            continue
        target.rollback(len(prompt) - 1)
        second = process(target.eval_block([prompt[-1], t1], "all")[-1].copy(), cfg)
        for t2, p2 in zip(second.ids.tolist(), second.probs.tolist(), strict=True):
            key = (t1, END) if t2 in eog else (t1, t2)
            law[key] = law.get(key, 0.0) + p1 * p2
    return law


@dataclass
class Samples:
    counts: Counter[Pair] = field(default_factory=Counter)
    whole_drafts: int = 0  # first steps that kept both drafted tokens
    cut_drafts: int = 0  # first steps that rejected one of them

    def summary(self, law: dict[Pair, float]) -> str:
        n = sum(self.counts.values())
        return f"{n} samples over {len(law)} cells, first draft kept whole in {self.whole_drafts / n:.0%}"


def first_two(rt: Runtime, prompt: str, seed: int) -> tuple[Pair, int]:
    """(t1, t2) of one run, and how many tokens its first step committed. The stream is
    closed as soon as both are known: a third token would only cost another step."""
    tokens: list[int] = []
    first_step = 0
    # max_tokens=3: the first step may then draft 2 tokens (γ is capped at tokens left - 1).
    with rt.stream(prompt, max_tokens=3, seed=seed, **SAMPLING) as stream:
        for event in stream:
            if isinstance(event, Finished):
                assert event.finish_reason == "stop", f"{len(tokens)} tokens, then {event.finish_reason!r}"
                tokens.append(END)
                break
            first_step = first_step or len(event.tokens)
            tokens.extend(event.tokens)
            if len(tokens) >= 2:
                break
    pair = (END,) if tokens[0] == END else tuple(tokens[:2])
    return pair, first_step


def sample_first_two(rt: Runtime, prompt: str, n: int) -> Samples:
    """n runs with seeds 0..n-1, so the test is reproducible."""
    samples = Samples()
    for seed in range(n):
        pair, first_step = first_two(rt, prompt, seed)
        samples.counts[pair] += 1
        if first_step == 3:
            samples.whole_drafts += 1
        else:
            samples.cut_drafts += 1
    return samples


def chi_square_p_value(counts: Counter[Pair], law: dict[Pair, float]) -> float:
    impossible = set(counts) - set(law)
    assert not impossible, f"sampled pairs the target gives probability 0: {sorted(impossible)[:5]}"
    n = sum(counts.values())
    keys = sorted(law, key=law.__getitem__, reverse=True)
    big = [k for k in keys if law[k] * n >= MIN_EXPECTED]
    small = [k for k in keys if law[k] * n < MIN_EXPECTED]
    observed = [counts[k] for k in big]
    expected = [law[k] * n for k in big]
    if small:
        observed.append(sum(counts[k] for k in small))
        expected.append(sum(law[k] for k in small) * n)
    expected_arr = np.array(expected) * n / sum(expected)  # absorb float drift in the sum
    return float(chisquare(observed, expected_arr).pvalue)


def worst_cells(counts: Counter[Pair], law: dict[Pair, float], k: int = 5) -> str:
    """The cells furthest from their expectation, in standard deviations: for failure messages."""
    n = sum(counts.values())
    z = {c: (counts[c] - n * p) / max(np.sqrt(n * p * (1 - p)), 1e-9) for c, p in law.items()}
    worst = sorted(z, key=lambda c: -abs(z[c]))[:k]
    return ", ".join(f"{c}: {counts[c]} seen, {n * law[c]:.1f} expected" for c in worst)


# Tiny models: 1000 runs a law (about 1 s with one thread) over at most 64 cells, those
# expecting fewer than 5 samples pooled, as many runs as the SmolLM2 test had before.
TINY_RUNS = 1000
# After its last token the lookup guesses the two tokens that followed it earlier, which
# the tiny target samples in a row about half the time; a model drafts the same prompt.
TINY_PROMPT = [1, 173, 60, 42, 179, 48, 48, 187, 103, 179]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LlamaCppBackend]]:
    """A tiny random llama and a drafter made of its weights perturbed: they agree often."""
    folder = tmp_path_factory.mktemp("sampling-models")
    files = {"target": Spec("llama"), "draft": Spec("llama", noise=0.2)}
    # One thread: a tiny model's pass is shorter than two threads' handshake on a busy host.
    opened = {
        name: LlamaCppBackend(str(write_gguf(spec, folder / f"{name}.gguf")), n_ctx=256, threads=1)
        for name, spec in files.items()
    }
    yield opened
    for backend in opened.values():
        backend.close()


def check_law(rt: Runtime, target: Backend, prompt: str | list[int], n: int, what: str) -> Samples:
    """n seeded runs of rt against the target's exact law; returns the samples for the
    test's own checks of which paths ran."""
    law = exact_first_two(target, rt.prompt_tokens(prompt), SamplingConfig(**SAMPLING))
    samples = sample_first_two(rt, prompt, n=n)
    p = chi_square_p_value(samples.counts, law)
    print(f"\n{what}: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
    return samples


def test_draft_model_sampling_on_smollm2_matches_the_targets_joint_law_of_the_first_two_tokens(
    target_backend: Backend, q4_drafter_backend: Backend
) -> None:
    # The real model and its Q4_0 requantization, its 49k vocabulary through top-k: 400
    # runs (about 16 s) still see any cell of the law off by a third of its mass; the tiny
    # models below check every drafter's law at 1000 runs.
    prompt = "Once upon a time, in a small village, there lived a"
    rt = runtime_for(target_backend, q4_drafter_backend, strategy="draft", draft_tokens=2, calibrate=False)
    samples = check_law(rt, target_backend, prompt, 400, "SmolLM2 draft-model sampling")
    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"


def test_draft_model_sampling_matches_the_targets_joint_law_of_the_first_two_tokens(
    tiny: dict[str, LlamaCppBackend],
) -> None:
    rt = runtime_for(tiny["target"], tiny["draft"], strategy="draft", draft_tokens=2, calibrate=False)
    samples = check_law(rt, tiny["target"], TINY_PROMPT, TINY_RUNS, "draft-model sampling")
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"


def test_ngram_sampling_matches_the_targets_joint_law_of_the_first_two_tokens(tiny: dict[str, LlamaCppBackend]) -> None:
    rt = runtime_for(tiny["target"], None, strategy="ngram", draft_tokens=2, calibrate=False)
    samples = check_law(rt, tiny["target"], TINY_PROMPT, TINY_RUNS, "n-gram sampling")
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"


def test_a_draft_model_beside_ngram_lookup_keeps_the_targets_joint_law(tiny: dict[str, LlamaCppBackend]) -> None:
    # The steps go to the lookup (one-hot guesses) and the drafter (its own law, after
    # catching up on what the lookup committed) in turn.
    rt = alternating_runtime(tiny["target"], tiny["draft"], 2)
    policy = rt.policy
    assert isinstance(policy, AlternatingSources)
    samples = check_law(rt, tiny["target"], TINY_PROMPT, TINY_RUNS, "lookup beside a draft model")
    assert policy.from_lookup > 0 and policy.from_model > 0
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"


@pytest.mark.parametrize("strategy", ["qspec:Q2_K", "layerskip:2"])
def test_self_drafting_matches_the_targets_joint_law_of_the_first_two_tokens(
    tiny: dict[str, LlamaCppBackend], strategy: str
) -> None:
    # The derived GGUFs (a Q2_K copy, whose 64-wide rows llama.cpp quantizes with Q2_K's
    # fallback type; the first 2 of 3 blocks) go through the same rejection sampling as
    # any draft model: the law must still be the target's alone.
    kind, _, option = strategy.partition(":")
    drafter = derive_drafter(tiny["target"], kind, option)
    try:
        rt = runtime_for(tiny["target"], drafter, strategy="draft", draft_tokens=2, calibrate=False)
        samples = check_law(rt, tiny["target"], TINY_PROMPT, TINY_RUNS, f"{strategy} sampling")
    finally:
        drafter.close()
    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"
