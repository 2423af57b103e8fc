"""frequency_penalty, presence_penalty and logit_bias as OpenAI defines them, applied to the
target's logits, with speculation still lossless: the output follows the penalised target's
law (chi-square on the reference backend) and greedy output equals penalised plain decoding.
And logprobs: each emitted token's log-probability under the shaped target logits, the same
with and without drafting."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import numpy as np
import pytest
from test_exactness import (
    DRAFT_NOISE,
    FULL,
    GREEDY_PROMPTS,
    GREEDY_VOCAB,
    N_RUNS,
    PROMPT,
    STOP,
    TRUNCATED,
    VOCAB,
    Outcome,
    chi_square_pvalue,
    outcome,
    run_rng,
)

from localspec.backends.reference import ReferenceBackend
from localspec.control.policy import FixedDraftLength
from localspec.core.engine import Engine, Step
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import LogprobRecorder, SamplingConfig, process, shape
from localspec.core.stats import Stats
from localspec.drafters import Drafter
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.none import NoDrafter

# Strong enough that the penalised law is far from the plain one: a repeat loses 1.6 in logit.
PENALTIES: dict[str, Any] = {"frequency_penalty": 1.0, "presence_penalty": 0.6, "logit_bias": ((5, 2.0), (7, -100.0))}

DRAFTERS: dict[str, Callable[[], Drafter]] = {
    "none": NoDrafter,
    "ngram": lambda: NgramDrafter(min_ngram=1),
    "model": lambda: ModelDrafter(ReferenceBackend(vocab_size=VOCAB, seed=0, noise=DRAFT_NOISE), min_confidence=0.0),
}


def openai_logits(row: Sequence[float], generated: Sequence[int], cfg: SamplingConfig) -> np.ndarray:
    """OpenAI's definition, written out: mu[j] - c[j]*frequency - (c[j] > 0)*presence + bias[j]."""
    out = np.array(row, dtype=np.float64)
    for token, count in Counter(generated).items():
        out[token] -= count * cfg.frequency_penalty + cfg.presence_penalty
    for token, bias in cfg.logit_bias:
        out[token] += bias
    return out


def penalised_probs(model: ReferenceBackend, context: list[int], n_prompt: int, cfg: SamplingConfig) -> np.ndarray:
    prev2 = context[-2] if len(context) > 1 else 0
    row = openai_logits(model.next_token_logits(prev2, context[-1]), context[n_prompt:], cfg)
    if cfg.greedy:
        return np.eye(row.size)[int(np.argmax(row))]
    return process(row, cfg).dense(row.size)


def penalised_joint(cfg: SamplingConfig) -> dict[Outcome, float]:
    """P(first two emitted tokens) under the penalised target, STOP for an ended generation."""
    model = ReferenceBackend(vocab_size=VOCAB, seed=0)
    eog = sorted(model.end_of_generation())
    p1 = penalised_probs(model, list(PROMPT), len(PROMPT), cfg)
    joint = {(STOP, STOP): float(p1[eog].sum())}
    for t1 in np.flatnonzero(p1).tolist():
        if t1 in eog:
            continue
        p2 = penalised_probs(model, [*PROMPT, t1], len(PROMPT), cfg)
        joint[(t1, STOP)] = float(p1[t1] * p2[eog].sum())
        joint.update({(t1, t2): float(p1[t1] * p2[t2]) for t2 in np.flatnonzero(p2).tolist() if t2 not in eog})
    return joint


def run(engine: Engine, prompt: Sequence[int], n: int, cfg: SamplingConfig, gamma: int, seed: int | None) -> list[int]:
    rng = run_rng(seed) if seed is not None else np.random.default_rng(0)
    steps = engine.generate(prompt, n, cfg, FixedDraftLength(gamma), Stats(), rng)
    tokens: list[int] = []
    with contextlib.closing(cast(Generator[Step, None, None], steps)):
        for step in steps:
            tokens += step.tokens
    return tokens


def test_shape_follows_openais_formula_row_by_row_through_a_draft() -> None:
    cfg = SamplingConfig(**PENALTIES)
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(3, VOCAB)).astype(np.float32)
    generated, draft = [4, 4, 9], [9, 3]
    shaped = shape(rows, cfg, generated, draft)
    for i in range(3):
        np.testing.assert_allclose(shaped[i], openai_logits(rows[i], [*generated, *draft[:i]], cfg), rtol=1e-6)
    assert shape(rows, SamplingConfig(), generated, draft) is rows  # nothing asked: nothing copied


@pytest.mark.parametrize(
    "bad",
    [{"frequency_penalty": 2.5}, {"presence_penalty": -3}, {"logit_bias": ((3, 101.0),)}, {"logit_bias": ((-1, 1.0),)}],
)
def test_penalties_and_biases_out_of_openais_range_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingConfig(**bad)


@pytest.mark.parametrize("base", [FULL, TRUNCATED], ids=["full", "truncated"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_first_two_tokens_follow_the_penalised_target_law(drafter: str, base: SamplingConfig) -> None:
    cfg = SamplingConfig(
        temperature=base.temperature, top_k=base.top_k, top_p=base.top_p, min_p=base.min_p, **PENALTIES
    )
    engine = Engine(ReferenceBackend(vocab_size=VOCAB, seed=0), DRAFTERS[drafter]())
    observed = Counter(outcome(run(engine, PROMPT, 2, cfg, 3, seed)) for seed in range(N_RUNS))
    assert observed[(7, STOP)] == 0 and not any(7 in o for o in observed)  # biased away
    assert chi_square_pvalue(observed, penalised_joint(cfg)) > 1e-3


def test_chi_square_rejects_output_that_ignores_the_penalties() -> None:
    # The control: plain output tested against the penalised law must fail.
    engine = Engine(ReferenceBackend(vocab_size=VOCAB, seed=0), NoDrafter())
    observed = Counter(outcome(run(engine, PROMPT, 2, FULL, 3, seed)) for seed in range(N_RUNS))
    assert chi_square_pvalue(observed, penalised_joint(SamplingConfig(**PENALTIES))) < 1e-6


GREEDY_PENALISED = SamplingConfig(temperature=0, frequency_penalty=0.4, presence_penalty=0.3)


def penalised_plain_decoding(prompt: list[int], n: int) -> list[int]:
    """Token by token, argmax of OpenAI's penalised logits."""
    model, context = ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), list(prompt)
    eog = model.end_of_generation()
    while len(context) - len(prompt) < n:
        token = int(np.argmax(penalised_probs(model, context, len(prompt), GREEDY_PENALISED)))
        if token in eog:
            break
        context.append(token)
    return context[len(prompt) :]


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_greedy_speculation_with_penalties_reproduces_penalised_plain_decoding(drafter: str, gamma: int) -> None:
    drafters: dict[str, Callable[[], Drafter]] = {
        "none": NoDrafter,
        "ngram": lambda: NgramDrafter(min_ngram=1),
        "model": lambda: ModelDrafter(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0, noise=DRAFT_NOISE), 0.0),
    }
    engine = Engine(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), drafters[drafter]())
    for prompt in GREEDY_PROMPTS:
        expected = penalised_plain_decoding(prompt, 32)
        assert run(engine, prompt, 32, GREEDY_PENALISED, gamma, None) == expected
    plain = SamplingConfig(temperature=0)
    assert any(run(engine, p, 32, plain, gamma, None) != penalised_plain_decoding(p, 32) for p in GREEDY_PROMPTS)


def test_logprobs_are_the_shaped_targets_log_softmax_and_the_same_with_drafting() -> None:
    def logprobs(drafter: Drafter, prompt: list[int]) -> LogprobRecorder:
        recorder = LogprobRecorder(3, lambda t: bytes([t]))
        cfg = SamplingConfig(temperature=0, frequency_penalty=0.4, logprobs=recorder)
        tokens = run(Engine(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), drafter), prompt, 24, cfg, 4, None)
        assert [e.token for e in recorder.entries] == tokens
        return recorder

    model = ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0)
    for prompt in GREEDY_PROMPTS[:3]:
        plain = logprobs(NoDrafter(), prompt)
        drafted = logprobs(NgramDrafter(min_ngram=1), prompt)
        assert plain.entries == drafted.entries
        context = list(prompt)
        for entry in plain.entries:
            prev2 = context[-2] if len(context) > 1 else 0
            row = openai_logits(model.next_token_logits(prev2, context[-1]), context[len(prompt) :], plain_cfg())
            expected = row - np.log(np.exp(row - row.max()).sum()) - row.max()
            assert entry.logprob == pytest.approx(expected[entry.token], abs=1e-5)
            assert [t for t, _, _ in entry.top] == list(np.argsort(-expected, kind="stable")[:3])
            assert entry.top[0][0] == entry.token  # greedy picks the most likely token
            context.append(entry.token)


def plain_cfg() -> SamplingConfig:
    return SamplingConfig(temperature=0, frequency_penalty=0.4)


# llama.cpp's repeat penalty: strong, over a window short enough that the prompt's head falls out of it.
REPEAT: dict[str, Any] = {"repeat_penalty": 1.8, "repeat_last_n": 4}


def llama_repeat_logits(row: Sequence[float], context: Sequence[int], cfg: SamplingConfig) -> np.ndarray:
    """llama.cpp's penalties sampler, written out: each distinct token among the context's last
    repeat_last_n (prompt included) has a positive logit divided by the penalty, else multiplied."""
    out = np.array(row, dtype=np.float64)
    window = context if cfg.repeat_last_n < 0 else context[len(context) - cfg.repeat_last_n :]
    for token in set(window):
        out[token] = out[token] / cfg.repeat_penalty if out[token] > 0 else out[token] * cfg.repeat_penalty
    return out


def repeat_probs(model: ReferenceBackend, context: list[int], cfg: SamplingConfig) -> np.ndarray:
    prev2 = context[-2] if len(context) > 1 else 0
    row = llama_repeat_logits(model.next_token_logits(prev2, context[-1]), context, cfg)
    if cfg.greedy:
        return np.eye(row.size)[int(np.argmax(row))]
    return process(row, cfg).dense(row.size)


def test_repeat_penalty_follows_llamacpps_rule_row_by_row_with_the_prompts_tail() -> None:
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(3, VOCAB)).astype(np.float32)
    prompt, generated, draft = [1, 2, 6, 4], [4, 0], [0, 3]
    for last_n in (4, -1):
        cfg = SamplingConfig(repeat_penalty=1.5, repeat_last_n=last_n)
        before = cfg.repeat_window(prompt, len(prompt))
        assert list(before) == (prompt if last_n < 0 else prompt[-4:])
        shaped = shape(rows, cfg, generated, draft, before)
        for i in range(3):
            expected = llama_repeat_logits(rows[i], [*prompt, *generated, *draft[:i]], cfg)
            np.testing.assert_allclose(shaped[i], expected, rtol=1e-6)
    assert shape(rows, SamplingConfig(repeat_penalty=1.5, repeat_last_n=0), generated, draft) is rows


@pytest.mark.parametrize("bad", [{"repeat_penalty": 0}, {"repeat_penalty": float("nan")}, {"repeat_last_n": -2}])
def test_repeat_penalties_out_of_range_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingConfig(**bad)


def repeat_joint(cfg: SamplingConfig) -> dict[Outcome, float]:
    """P(first two emitted tokens) under the repeat-penalised target."""
    model = ReferenceBackend(vocab_size=VOCAB, seed=0)
    eog = sorted(model.end_of_generation())
    p1 = repeat_probs(model, list(PROMPT), cfg)
    joint = {(STOP, STOP): float(p1[eog].sum())}
    for t1 in np.flatnonzero(p1).tolist():
        if t1 in eog:
            continue
        p2 = repeat_probs(model, [*PROMPT, t1], cfg)
        joint[(t1, STOP)] = float(p1[t1] * p2[eog].sum())
        joint.update({(t1, t2): float(p1[t1] * p2[t2]) for t2 in np.flatnonzero(p2).tolist() if t2 not in eog})
    return joint


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_first_two_tokens_follow_the_repeat_penalised_target_law(drafter: str) -> None:
    cfg = SamplingConfig(temperature=FULL.temperature, top_k=FULL.top_k, top_p=FULL.top_p, min_p=FULL.min_p, **REPEAT)
    engine = Engine(ReferenceBackend(vocab_size=VOCAB, seed=0), DRAFTERS[drafter]())
    observed = Counter(outcome(run(engine, PROMPT, 2, cfg, 3, seed)) for seed in range(N_RUNS))
    assert chi_square_pvalue(observed, repeat_joint(cfg)) > 1e-3


def test_chi_square_rejects_output_that_ignores_the_repeat_penalty() -> None:
    engine = Engine(ReferenceBackend(vocab_size=VOCAB, seed=0), NoDrafter())
    observed = Counter(outcome(run(engine, PROMPT, 2, FULL, 3, seed)) for seed in range(N_RUNS))
    assert chi_square_pvalue(observed, repeat_joint(SamplingConfig(**REPEAT))) < 1e-6


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_greedy_speculation_with_a_repeat_penalty_reproduces_penalised_plain_decoding(drafter: str, gamma: int) -> None:
    cfg = SamplingConfig(temperature=0, repeat_penalty=1.3, repeat_last_n=8)
    drafters: dict[str, Callable[[], Drafter]] = {
        "none": NoDrafter,
        "ngram": lambda: NgramDrafter(min_ngram=1),
        "model": lambda: ModelDrafter(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0, noise=DRAFT_NOISE), 0.0),
    }
    engine = Engine(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), drafters[drafter]())
    model = ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0)
    eog = model.end_of_generation()
    differs = False
    for prompt in GREEDY_PROMPTS:
        context = list(prompt)
        while len(context) - len(prompt) < 32:
            token = int(np.argmax(repeat_probs(model, context, cfg)))
            if token in eog:
                break
            context.append(token)
        assert run(engine, prompt, 32, cfg, gamma, None) == context[len(prompt) :]
        differs |= run(engine, prompt, 32, SamplingConfig(temperature=0), gamma, None) != context[len(prompt) :]
    assert differs  # the penalty changed some answer
