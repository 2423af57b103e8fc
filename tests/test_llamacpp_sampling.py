"""Speculative sampling on the real SmolLM2-135M draws the first two tokens from the target's
own distribution, whatever the drafter proposes.

The exact law of (t1, t2) is computed from the target: p(t1) from the logits after the
prompt, p(t2 | t1) from the logits after prompt + t1, both shaped by the same sampler
chain (`process`) and SamplingConfig the engine uses. A chi-square test then compares it
with the tokens that speculative runs (fixed seeds, so the test is reproducible) produce.

Approximation: the engine gets these logits from verify blocks of 2-3 tokens, and after a
rejection from a second block whose first position was cached by the first one. On this
llama.cpp build every block under 64 tokens gives bit-identical rows, so the exact
law below is computed from 2-token blocks over the same one-block prefill the engine uses;
any residual rounding is orders of magnitude below what a few thousand samples can see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from scipy.stats import chisquare
from sources import AlternatingSources

from localspec.api import Finished, Runtime, derive_drafter
from localspec.core.protocol import Backend
from localspec.core.sampling import SamplingConfig, process
from localspec.drafters.ngram import NgramDrafter

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
    target.eval_block(list(prompt[:-1]), "none")  # one block, like the engine's prefill
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


def test_draft_model_sampling_matches_the_targets_joint_law_of_the_first_two_tokens(
    target_backend: Backend, q4_drafter_backend: Backend
) -> None:
    prompt = "Once upon a time, in a small village, there lived a"
    rt = Runtime(target_backend, q4_drafter_backend, strategy="draft", draft_tokens=2, calibrate=False)
    law = exact_first_two(target_backend, rt.prompt_tokens(prompt), SamplingConfig(**SAMPLING))

    samples = sample_first_two(rt, prompt, n=1000)

    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"
    p = chi_square_p_value(samples.counts, law)
    print(f"\ndraft-model sampling: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_ngram_sampling_matches_the_targets_joint_law_of_the_first_two_tokens(target_backend: Backend) -> None:
    # The last tokens repeat earlier text, so the n-gram drafter proposes " blue green",
    # which the target likes only about half the time at temperature 1.
    prompt = "red blue green red blue green red blue green red"
    rt = Runtime(target_backend, None, strategy="ngram", draft_tokens=2, calibrate=False)
    law = exact_first_two(target_backend, rt.prompt_tokens(prompt), SamplingConfig(**SAMPLING))

    samples = sample_first_two(rt, prompt, n=600)

    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
    p = chi_square_p_value(samples.counts, law)
    print(f"\nn-gram sampling: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_a_draft_model_beside_ngram_lookup_keeps_the_targets_joint_law(
    target_backend: Backend, q4_drafter_backend: Backend
) -> None:
    # The steps go to the lookup (one-hot guesses of " blue green") and the Q4_0 model (its
    # own law, after catching up on what the lookup committed) in turn.
    prompt = "red blue green red blue green red blue green red"
    rt = Runtime(target_backend, q4_drafter_backend, strategy="draft", draft_tokens=2, calibrate=False)
    policy = AlternatingSources(2)
    rt.engine.lookup, rt.policy = NgramDrafter(), policy
    law = exact_first_two(target_backend, rt.prompt_tokens(prompt), SamplingConfig(**SAMPLING))

    samples = sample_first_two(rt, prompt, n=600)

    assert policy.from_lookup > 0 and policy.from_model > 0
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
    p = chi_square_p_value(samples.counts, law)
    print(f"\nlookup beside a draft model: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)


@pytest.mark.parametrize("strategy", ["qspec:Q2_K", "layerskip:20"])
def test_self_drafting_matches_the_targets_joint_law_of_the_first_two_tokens(
    target_backend: Backend, strategy: str
) -> None:
    # The derived GGUFs (a Q2_K copy; the first 20 of 30 blocks) go through the same
    # rejection sampling as any draft model: the law must still be the target's alone.
    kind, _, option = strategy.partition(":")
    drafter = derive_drafter(target_backend, kind, option)
    try:
        prompt = "Once upon a time, in a small village, there lived a"
        rt = Runtime(target_backend, drafter, strategy="draft", draft_tokens=2, calibrate=False)
        law = exact_first_two(target_backend, rt.prompt_tokens(prompt), SamplingConfig(**SAMPLING))
        samples = sample_first_two(rt, prompt, n=800)
    finally:
        drafter.close()
    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"
    p = chi_square_p_value(samples.counts, law)
    print(f"\n{strategy} sampling: {samples.summary(law)}, chi-square p = {p:.3f}")
    assert p > P_FLOOR, worst_cells(samples.counts, law)
