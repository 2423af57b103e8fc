"""Jump-forward: what a request's grammar forces is drafted for nothing as a point-mass draft
and verified in the same pass. The output stays masked plain decoding's (greedy) and follows
the masked target's law (chi-square); a schema with fixed keys gets forced tokens counted."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Generator, Sequence
from typing import cast

import numpy as np
import pytest
from test_exactness import N_RUNS, STOP, chi_square_pvalue, run_rng
from test_sampling_grammar import DRAFTERS, RECORD, SAMPLED, constraint, masked_plain_decoding, masked_probs, model
from test_sampling_grammar import prompt_of as tokens_of

from localspec.control.policy import FixedDraftLength
from localspec.core.engine import Engine
from localspec.core.grammar import GrammarConstraint
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats, Step

CHOICE = {
    "type": "json_schema",
    "json_schema": {
        "schema": {
            "type": "object",
            "properties": {"colour": {"enum": ["x", "y", "z"]}},
            "required": ["colour"],
            "additionalProperties": False,
        }
    },
}
OPENING = '{"colour":"'  # what CHOICE forces before its one choice


class NoJump:
    """A constraint without forced(): the engine drafts as it would without jump-forward."""

    def __init__(self, inner: GrammarConstraint) -> None:
        self.inner = inner

    def allowed_prefix(self, draft: Sequence[int]) -> int:
        return self.inner.allowed_prefix(draft)

    def mask(self, rows: np.ndarray, draft: Sequence[int], start: int = 0) -> None:
        self.inner.mask(rows, draft, start)

    def commit(self, tokens: Sequence[int]) -> None:
        self.inner.commit(tokens)


def run(engine: Engine, prompt: list[int], n: int, cfg: SamplingConfig, gamma: int, rng: np.random.Generator):
    stats = Stats()
    steps = engine.generate(prompt, n, cfg, FixedDraftLength(gamma), stats, rng)
    tokens: list[int] = []
    with contextlib.closing(cast(Generator[Step, None, None], steps)):
        for step in steps:
            tokens += step.tokens
    return tokens, stats


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_with_jump_forward_is_masked_plain_decoding_and_counts_forced_tokens(drafter: str) -> None:
    backend = model()
    for text in ("give me a record", '{"id": 7, "tag": "green"} {"id": 8, "tag": "'):
        prompt = tokens_of(backend, text)
        expected = masked_plain_decoding(model(), prompt, 40)
        on = SamplingConfig(temperature=0, constraint=constraint(backend, RECORD))
        got, stats = run(Engine(backend, DRAFTERS[drafter]()), prompt, 40, on, 4, np.random.default_rng(0))
        off = SamplingConfig(temperature=0, constraint=NoJump(constraint(backend, RECORD)))
        plain, plain_stats = run(Engine(backend, DRAFTERS[drafter]()), prompt, 40, off, 4, np.random.default_rng(0))
        assert got == expected == plain
        assert stats.forced >= len('{"id":') and plain_stats.forced == 0  # the record's keys are fixed
        assert stats.forced <= stats.accepted


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_sampled_with_jump_forward_follows_the_masked_target_law(drafter: str) -> None:
    # The opening is forced, then one of three values is sampled: its law must be the masked
    # target's at that point, with the forced tokens counted for every run.
    backend = model()
    prompt = tokens_of(backend, "colour: ")
    engine = Engine(backend, DRAFTERS[drafter]())
    observed: Counter[tuple[int, int]] = Counter()
    forced = 0
    for seed in range(N_RUNS // 3):
        cfg = SamplingConfig(**{**vars(SAMPLED), "constraint": constraint(backend, CHOICE)})
        tokens, stats = run(engine, prompt, len(OPENING) + 1, cfg, 3, run_rng(seed))
        head = bytes(backend.token_bytes(t)[0] for t in tokens[: len(OPENING)]).decode()
        assert head == OPENING
        observed[(tokens[len(OPENING)], STOP)] += 1
        forced += stats.forced
    assert forced >= len(OPENING) * (N_RUNS // 3)
    grammar = constraint(backend, CHOICE)
    context = list(prompt)
    for t in tokens[: len(OPENING)]:
        grammar.matcher.consume_token(t)
        context.append(t)
    p = masked_probs(backend, context, grammar, SAMPLED)
    law = {(int(t), STOP): float(p[t]) for t in np.flatnonzero(p)}
    assert len(law) == 3
    assert chi_square_pvalue(observed, law) > 1e-3
