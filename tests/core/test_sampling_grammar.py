"""A grammar (a JSON schema through llguidance) constrains the target's distribution, and
speculation stays exact under it: drafts outside the grammar are refused like any token the
target gives p = 0, so sampled output follows the masked target's law (chi-square) and greedy
output equals masked plain decoding. The reference backend's byte vocabulary is the tokenizer."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest
from test_exactness import DRAFT_NOISE, N_RUNS, STOP, Outcome, chi_square_pvalue, outcome, run_rng
from test_sampling_penalties import run

from localspec.backends.reference import BOS, ReferenceBackend
from localspec.core.engine import Engine
from localspec.core.sampling import SamplingConfig, process
from localspec.drafters import Drafter
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.none import NoDrafter
from localspec.server.grammar import GrammarConstraint, Grammars

BYTES = 259  # BOS, EOS, end of turn, then one token per byte
INTEGER = {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}
RECORD = {
    "type": "json_schema",
    "json_schema": {
        "schema": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tag": {"enum": ["red", "green", "blue"]}},
            "required": ["id", "tag"],
            "additionalProperties": False,
        }
    },
}
SAMPLED = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)

DRAFTERS: dict[str, Callable[[], Drafter]] = {
    "none": NoDrafter,
    "ngram": lambda: NgramDrafter(min_ngram=1),
    "model": lambda: ModelDrafter(ReferenceBackend(vocab_size=BYTES, seed=0, noise=DRAFT_NOISE), min_confidence=0.0),
}


def model() -> ReferenceBackend:
    return ReferenceBackend(vocab_size=BYTES, seed=0)


def prompt_of(backend: ReferenceBackend, text: str) -> list[int]:
    return backend.tokenize(text, add_special=True, parse_special=False)


@cache
def grammars() -> Grammars:
    return Grammars(model())  # every reference model of this size has the same vocabulary


def constraint(backend: ReferenceBackend, response_format: dict[str, Any]) -> GrammarConstraint:
    made = grammars().constraint(response_format)
    assert made is not None
    return made


def masked_probs(backend: ReferenceBackend, context: list[int], grammar: GrammarConstraint, cfg: SamplingConfig):
    prev2 = context[-2] if len(context) > 1 else BOS
    row = np.array(backend.next_token_logits(prev2, context[-1]), dtype=np.float64)
    allowed = np.frombuffer(grammar.matcher.compute_logit_bias(), dtype=np.uint8)[:BYTES]
    row[allowed == 0] = -np.inf
    if cfg.greedy:
        return np.eye(BYTES)[int(np.argmax(row))]
    return process(row, cfg).dense(BYTES)


def masked_joint(prompt: list[int], cfg: SamplingConfig) -> dict[Outcome, float]:
    """P(first two emitted tokens) under the target masked by the integer grammar."""
    backend = model()
    eog = sorted(backend.end_of_generation())
    grammar = constraint(backend, INTEGER)
    p1 = masked_probs(backend, prompt, grammar, cfg)
    joint = {(STOP, STOP): float(p1[eog].sum())}
    for t1 in np.flatnonzero(p1).tolist():
        if t1 in eog:
            continue
        grammar.matcher.consume_token(t1)
        p2 = masked_probs(backend, [*prompt, t1], grammar, cfg)
        grammar.matcher.rollback(1)
        joint[(t1, STOP)] = float(p1[t1] * p2[eog].sum())
        joint.update({(t1, t2): float(p1[t1] * p2[t2]) for t2 in np.flatnonzero(p2).tolist() if t2 not in eog})
    return joint


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_first_two_tokens_follow_the_masked_target_law(drafter: str) -> None:
    backend = model()
    prompt = prompt_of(backend, "count: 1 2 3 12 13 1")
    engine = Engine(backend, DRAFTERS[drafter]())
    observed: Counter[Outcome] = Counter()
    for seed in range(N_RUNS):
        cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, constraint=constraint(backend, INTEGER))
        observed[outcome(run(engine, prompt, 2, cfg, 3, seed))] += 1
    assert all(t in (STOP, *range(3 + ord("0"), 3 + ord("9") + 1), 3 + ord("-")) for o in observed for t in o)
    assert chi_square_pvalue(observed, masked_joint(prompt, SAMPLED)) > 1e-3


def test_chi_square_rejects_unmasked_sampling_cut_at_the_first_ungrammatical_token() -> None:
    # The control: drawing from the plain target and ending where the text leaves the
    # grammar is another law, which the test above must tell apart.
    backend = model()
    prompt = prompt_of(backend, "count: 1 2 3 12 13 1")
    observed: Counter[Outcome] = Counter()
    digits = set(range(3 + ord("1"), 3 + ord("9") + 1))
    rng = run_rng(0)
    # Drawing t1 from the target until it is a digit is drawing it from the digits' renormalized law.
    first = backend.exact_probs(prompt, SAMPLED)
    starts = sorted(digits)
    weights = first[starts] / first[starts].sum()
    kept = digits | {3 + ord("0")}
    for t1 in rng.choice(starts, size=N_RUNS, p=weights).tolist():
        t2 = int(rng.choice(BYTES, p=backend.exact_probs([*prompt, t1], SAMPLED)))
        observed[(t1, t2 if t2 in kept else STOP)] += 1
    assert chi_square_pvalue(observed, masked_joint(prompt, SAMPLED)) < 1e-6


def masked_plain_decoding(backend: ReferenceBackend, prompt: list[int], n: int) -> list[int]:
    grammar, context = constraint(backend, RECORD), list(prompt)
    eog = backend.end_of_generation()
    while len(context) - len(prompt) < n:
        token = int(np.argmax(masked_probs(backend, context, grammar, SamplingConfig(temperature=0))))
        if token in eog:
            break
        grammar.matcher.consume_token(token)
        context.append(token)
    return context[len(prompt) :]


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_speculation_under_a_schema_reproduces_masked_plain_decoding(drafter: str, gamma: int) -> None:
    backend = model()
    engine = Engine(backend, DRAFTERS[drafter]())
    for text in ('{"id": 7, "tag": "green"} {"id": 8, "tag": "', "give me a record", '{"id":'):
        prompt = prompt_of(backend, text)
        expected = masked_plain_decoding(model(), prompt, 40)
        cfg = SamplingConfig(temperature=0, constraint=constraint(backend, RECORD))
        got = run(engine, prompt, 40, cfg, gamma, None)
        assert got == expected
        text_out = bytes(backend.token_bytes(t)[0] for t in got).decode()
        if len(got) < 40:  # ended by the grammar: a whole, valid record
            record = json.loads(text_out)
            assert set(record) == {"id", "tag"} and record["tag"] in ("red", "green", "blue")


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=0), SAMPLED], ids=["greedy", "sampled"])
def test_a_draft_model_drafts_inside_the_grammar(cfg: SamplingConfig) -> None:
    # Its rows are masked by the same shape call as the target's, so it proposes only what the
    # grammar allows; unmasked, its proposals leave the grammar (the control).
    backend = model()
    prompt = prompt_of(backend, "give me a record")
    grammar = constraint(backend, RECORD)
    drafter = ModelDrafter(ReferenceBackend(vocab_size=BYTES, seed=0, noise=DRAFT_NOISE), min_confidence=0.0)
    drafter.start(prompt)
    rng = np.random.default_rng(0)
    masked = drafter.propose(prompt, 12, SamplingConfig(**{**vars_of(cfg), "constraint": grammar}), rng)
    assert len(masked.tokens) == 12 and grammar.allowed_prefix(masked.tokens) == 12
    if masked.dists is not None:  # q is the masked law the tokens were drawn from
        assert all(d.prob(t) > 0 for d, t in zip(masked.dists, masked.tokens, strict=True))
        for i, dist in enumerate(masked.dists):
            drawn = dist.ids[dist.probs > 0].tolist()
            assert all(grammar.allowed_prefix([*masked.tokens[:i], t]) == i + 1 for t in drawn)
    drafter.commit(prompt, 0)
    plain = drafter.propose(prompt, 12, cfg, np.random.default_rng(0))
    assert grammar.allowed_prefix(plain.tokens) < len(plain.tokens)


def vars_of(cfg: SamplingConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in ("temperature", "top_k", "top_p", "min_p")}
