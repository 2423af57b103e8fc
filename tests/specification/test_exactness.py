"""Speculation must not change what the target says.

Every test runs the real Engine on the reference backend, whose next-token distribution is
known in closed form, so "lossless" is checked against exact numbers: sampled output must
follow the target's law (chi-square), greedy output must equal plain decoding token for
token, and after rejections the caches must hold exactly the committed text.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import cast

import numpy as np
import pytest
from scipy.stats import chisquare
from sources import AlternatingSources

from localspec.backends.reference import BOS, ReferenceBackend
from localspec.control.policy import FixedDraftLength
from localspec.core.drafting import DraftLengthPolicy
from localspec.core.engine import Engine, Step
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats
from localspec.drafters import Drafter
from localspec.drafters.memory import NgramMemory
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.none import NoDrafter

VOCAB = 12
DRAFT_NOISE = 0.5  # the drafter's law overlaps the target's by about 70%: many rejections
# Repeats itself, so the n-gram drafter has something to propose.
PROMPT = [BOS, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
FULL = SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
TRUNCATED = SamplingConfig(temperature=0.7, top_k=6, top_p=0.9, min_p=0.05)
GREEDY = SamplingConfig(temperature=0.0)
# About 0.1-0.5 ms per run on 2 cores; 3000 runs detect a residual drawn from p instead of
# max(0, p - q) at p < 1e-6 (see the controls below).
N_RUNS = 3000
MASTER_SEED = 20240611
# The engine ends a run at EOS / end of turn without emitting it: an outcome slot after the
# end reads STOP, which the exact law below accounts for the same way.
STOP = -1

Outcome = tuple[int, int]


def target() -> ReferenceBackend:
    return ReferenceBackend(vocab_size=VOCAB, seed=0)


def draft_model() -> ReferenceBackend:
    return ReferenceBackend(vocab_size=VOCAB, seed=0, noise=DRAFT_NOISE)


def remembering(documents: Sequence[Sequence[int]]) -> NgramDrafter:
    """n-gram lookup that drafts from a memory of these earlier requests' tokens alone: its
    own n-grams are longer than any text here, so every guess is a recalled one."""
    memory = NgramMemory()
    for document in documents:
        memory.add(document)
    return NgramDrafter(min_ngram=64, memory=memory)


def sampled_request(seed: int, n: int = 12) -> list[int]:
    """PROMPT and n tokens the target sampled after it."""
    model, context, rng = target(), list(PROMPT), np.random.default_rng(seed)
    for _ in range(n):
        context.append(int(rng.choice(VOCAB, p=model.exact_probs(context, FULL))))
    return context


# Earlier requests that began like PROMPT: they match further back than the prompt's own
# repeats, so their continuations (sometimes right, sometimes not) are what gets drafted.
REMEMBERED = [sampled_request(seed) for seed in range(3)]

DRAFTERS: dict[str, Callable[[], Drafter]] = {
    "none": NoDrafter,
    "ngram": lambda: NgramDrafter(min_ngram=1),
    "ngram-memory": lambda: remembering(REMEMBERED),
    "model": lambda: ModelDrafter(draft_model(), min_confidence=0.0),
    # Stops after a token it gave less than 35 %: about half the drafts end early here.
    "model-confidence": lambda: ModelDrafter(draft_model(), min_confidence=0.35),
}


def run_rng(run: int) -> np.random.Generator:
    return np.random.default_rng([MASTER_SEED, run])


def emitted(
    engine: Engine,
    prompt: Sequence[int],
    max_tokens: int,
    cfg: SamplingConfig,
    gamma: int | DraftLengthPolicy,
    rng: np.random.Generator,
    stats: Stats,
    enough: int | None = None,
) -> list[int]:
    """The tokens a request yields; with `enough`, the request is abandoned once that many came."""
    policy = FixedDraftLength(gamma) if isinstance(gamma, int) else gamma
    steps = engine.generate(prompt, max_tokens, cfg, policy, stats, rng)
    tokens: list[int] = []
    # generate() is a generator; closing it early is what a caller hitting a stop string does.
    with contextlib.closing(cast(Generator[Step, None, None], steps)):
        for step in steps:
            tokens += step.tokens
            if enough is not None and len(tokens) >= enough:
                break
    return tokens


def outcome(tokens: Sequence[int]) -> Outcome:
    padded = [*tokens[:2], STOP, STOP]
    return padded[0], padded[1]


def cut_at_end(tokens: Sequence[int], eog: frozenset[int]) -> list[int]:
    """What the engine would emit for this token sequence: everything before the first end."""
    ends = [i for i, t in enumerate(tokens) if t in eog]
    return list(tokens[: ends[0]] if ends else tokens)


def exact_joint(model: ReferenceBackend, prompt: list[int], cfg: SamplingConfig) -> dict[Outcome, float]:
    """P(first two emitted tokens) under the target, with STOP for "generation had ended"."""
    eog = sorted(model.end_of_generation())
    p1 = model.exact_probs(prompt, cfg)
    joint = {(STOP, STOP): float(p1[eog].sum())}
    for t1 in np.flatnonzero(p1).tolist():
        if t1 in eog:
            continue
        p2 = model.exact_probs([*prompt, t1], cfg)
        joint[(t1, STOP)] = float(p1[t1] * p2[eog].sum())
        joint.update({(t1, t2): float(p1[t1] * p2[t2]) for t2 in np.flatnonzero(p2).tolist() if t2 not in eog})
    return joint


def chi_square_pvalue(observed: Counter[Outcome], law: dict[Outcome, float]) -> float:
    """Pearson's test of observed outcomes against an exact law. Cells expected fewer than 5
    times are pooled (the chi-square approximation needs it); an outcome the law gives
    probability 0 makes the p-value 0, since under the law it cannot happen."""
    if any(law.get(o, 0.0) == 0.0 for o in observed):
        return 0.0
    cells = [o for o, p in law.items() if p > 0]
    probs = np.array([law[o] for o in cells])
    expected = probs / probs.sum() * sum(observed.values())
    counts = np.array([observed[o] for o in cells], dtype=np.float64)
    big = expected >= 5
    f_exp, f_obs = list(expected[big]), list(counts[big])
    if not big.all():
        rest_exp, rest_obs = float(expected[~big].sum()), float(counts[~big].sum())
        if rest_exp >= 5:
            f_exp.append(rest_exp)
            f_obs.append(rest_obs)
        else:  # too little to stand alone: fold it into the smallest cell
            i = int(np.argmin(f_exp))
            f_exp[i] += rest_exp
            f_obs[i] += rest_obs
    return float(chisquare(f_obs, f_exp).pvalue)


@pytest.mark.parametrize(
    "max_tokens",
    # 2 caps γ at 1: the second token is the bonus token after a full acceptance.
    # 4 lets γ = 3: the second token comes from draft position 1.
    [2, 4],
    ids=["bonus-token", "deep-draft"],
)
@pytest.mark.parametrize("cfg", [FULL, TRUNCATED], ids=["full", "truncated"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_first_two_tokens_follow_the_target_law(drafter: str, cfg: SamplingConfig, max_tokens: int) -> None:
    engine = Engine(target(), DRAFTERS[drafter]())
    observed: Counter[Outcome] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        tokens = emitted(engine, PROMPT, max_tokens, cfg, 3, run_rng(run), stats, enough=2)
        if len(tokens) < 2:
            assert stats.finish_reason == "stop"
        observed[outcome(tokens)] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    if drafter != "none":  # the run must have exercised both acceptance and rejection
        assert drafted > accepted > 0
    assert chi_square_pvalue(observed, exact_joint(target(), PROMPT, cfg)) > 1e-3


@pytest.mark.parametrize("drafter", ["ngram-memory", "model"])
def test_seeded_requests_follow_the_target_law(drafter: str) -> None:
    # Each run its own seed: the seeded rule (a uniform per position) must be p's law too.
    engine = Engine(target(), DRAFTERS[drafter]())
    observed: Counter[Outcome] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        cfg = dataclasses.replace(FULL, seed=MASTER_SEED + run)
        observed[outcome(emitted(engine, PROMPT, 4, cfg, 3, run_rng(run), stats, enough=2))] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0
    assert chi_square_pvalue(observed, exact_joint(target(), PROMPT, FULL)) > 1e-3


@pytest.mark.parametrize("cfg", [FULL, TRUNCATED], ids=["full", "truncated"])
def test_a_seed_fixes_the_answer_whatever_was_drafted(cfg: SamplingConfig) -> None:
    # Plain decoding, drafts recalled from memory at several lengths, a draft model: with one
    # seed, one answer; the generator handed to the engine (which drafters draw from) differs.
    seeded = dataclasses.replace(cfg, seed=7)
    answers = set()
    for drafter, gamma in [("none", 0), ("ngram-memory", 1), ("ngram-memory", 3), ("model", 2), ("ngram", 4)]:
        for run in range(3):
            stats = Stats()
            answers.add(
                tuple(emitted(Engine(target(), DRAFTERS[drafter]()), PROMPT, 24, seeded, gamma, run_rng(run), stats))
            )
    assert len(answers) == 1


@pytest.mark.parametrize("cfg", [FULL, TRUNCATED], ids=["full", "truncated"])
def test_chi_square_rejects_a_verifier_that_accepts_every_draft(cfg: SamplingConfig) -> None:
    # Accepting everything emits the drafter's own law; the test above must see that.
    drafter = ModelDrafter(draft_model())
    eog = target().end_of_generation()
    observed: Counter[Outcome] = Counter()
    for run in range(N_RUNS):
        drafter.start(PROMPT)
        draft = drafter.propose(PROMPT, 2, cfg, run_rng(run))
        observed[outcome(cut_at_end(draft.tokens, eog))] += 1
    assert chi_square_pvalue(observed, exact_joint(target(), PROMPT, cfg)) < 1e-6


def test_chi_square_rejects_resampling_from_the_target_after_a_rejection() -> None:
    # The classic bug: on rejection draw from p instead of norm(max(0, p - q)). Its law,
    # min(p, q) + (1 - Σ min(p, q))·p, stays close to p; the test must still tell them apart.
    model, drafter = target(), ModelDrafter(draft_model())
    eog = model.end_of_generation()
    p1 = model.exact_probs(PROMPT, FULL)
    observed: Counter[Outcome] = Counter()
    for run in range(N_RUNS):
        rng = run_rng(run)
        drafter.start(PROMPT)
        draft = drafter.propose(PROMPT, 1, FULL, rng)
        assert draft.dists is not None
        x, q = draft.tokens[0], draft.dists[0]
        t1 = x if rng.random() * q.prob(x) < p1[x] else int(rng.choice(VOCAB, p=p1))
        tokens = [t1]
        if t1 not in eog:
            tokens.append(int(rng.choice(VOCAB, p=model.exact_probs([*PROMPT, t1], FULL))))
        observed[outcome(cut_at_end(tokens, eog))] += 1
    assert chi_square_pvalue(observed, exact_joint(model, PROMPT, FULL)) < 1e-6


# Greedy decoding needs trajectories that differ per prompt and that drafters sometimes
# miss; with 32 tokens the reference model's greedy paths do both (with 12 they all fall
# into one cycle).
GREEDY_VOCAB = 32
GREEDY_TOKENS = 48
GREEDY_PROMPTS = [
    [BOS, *np.random.default_rng(7 + n).integers(3, GREEDY_VOCAB, size=n).tolist()] for n in (4, 6, 8, 10, 12)
]
GREEDY_DRAFTERS: dict[str, Callable[[], Drafter]] = {
    "none": NoDrafter,
    "ngram": lambda: NgramDrafter(min_ngram=1),
    # The answers to two of the prompts, and a near miss of a third (its answer, changed).
    "ngram-memory": lambda: remembering(
        [
            *([*p, *plain_decoding(p)] for p in GREEDY_PROMPTS[:2]),
            [*GREEDY_PROMPTS[2], *[(t + 1) % GREEDY_VOCAB for t in plain_decoding(GREEDY_PROMPTS[2])]],
        ]
    ),
    "model": lambda: ModelDrafter(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0, noise=DRAFT_NOISE), 0.0),
    "model-confidence": lambda: ModelDrafter(
        ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0, noise=DRAFT_NOISE), min_confidence=0.35
    ),
}


def greedy_tokens(engine: Engine, prompt: list[int], gamma: int | DraftLengthPolicy, stats: Stats) -> list[int]:
    rng = np.random.default_rng(MASTER_SEED)  # greedy must not draw from it; any seed will do
    return emitted(engine, prompt, GREEDY_TOKENS, GREEDY, gamma, rng, stats)


def plain_decoding(prompt: list[int]) -> list[int]:
    """Token by token, argmax of the target's logits: what every drafter must reproduce."""
    model, context = ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), list(prompt)
    eog = model.end_of_generation()
    while len(context) - len(prompt) < GREEDY_TOKENS:
        token = int(np.argmax(model.exact_probs(context, GREEDY)))
        if token in eog:
            break
        context.append(token)
    return context[len(prompt) :]


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter", GREEDY_DRAFTERS)
def test_greedy_speculation_reproduces_plain_decoding(drafter: str, gamma: int) -> None:
    engine = Engine(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), GREEDY_DRAFTERS[drafter]())
    drafted = accepted = 0
    for prompt in GREEDY_PROMPTS:  # one engine for all: each request rolls back to the shared BOS
        stats = Stats()
        assert greedy_tokens(engine, prompt, gamma, stats) == plain_decoding(prompt)
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    if drafter != "none":
        assert drafted > accepted > 0


@pytest.mark.parametrize("cfg", [FULL, TRUNCATED], ids=["full", "truncated"])
def test_a_draft_model_beside_ngram_lookup_keeps_the_target_law(cfg: SamplingConfig) -> None:
    # The first step drafts from the lookup (one-hot proposals), the second from the model
    # (its own law) after catching up on what the lookup's draft committed.
    engine = Engine(target(), ModelDrafter(draft_model(), min_confidence=0.0), lookup=NgramDrafter())
    observed: Counter[Outcome] = Counter()
    policy = AlternatingSources(3)
    for run in range(N_RUNS):
        policy.steps = 0
        tokens = emitted(engine, PROMPT, 4, cfg, policy, run_rng(run), Stats(), enough=2)
        observed[outcome(tokens)] += 1
    assert policy.from_lookup > 0 and policy.from_model > 0
    assert chi_square_pvalue(observed, exact_joint(target(), PROMPT, cfg)) > 1e-3


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_a_draft_model_beside_ngram_lookup_reproduces_plain_decoding(gamma: int) -> None:
    drafter = GREEDY_DRAFTERS["model"]()
    engine = Engine(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0), drafter, lookup=NgramDrafter())
    policy = AlternatingSources(gamma)
    drafted = accepted = from_lookup = 0
    for prompt in GREEDY_PROMPTS:
        stats = Stats()
        assert greedy_tokens(engine, prompt, policy, stats) == plain_decoding(prompt)
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        from_lookup += stats.lookup_drafted
        assert stats.lookup_accepted <= stats.accepted
    assert policy.from_lookup > 0 and policy.from_model > 0
    assert drafted > accepted > 0
    assert 0 < from_lookup < drafted  # the statistics tell the two sources apart


def test_caches_after_rejections_hold_exactly_the_committed_text() -> None:
    target_model, draft_backend = target(), draft_model()
    engine = Engine(target_model, ModelDrafter(draft_backend, min_confidence=0.0))
    stats = Stats()
    tokens = emitted(engine, PROMPT, 10, FULL, 4, run_rng(1), stats)
    # Preconditions for this seed: the run went to max_tokens (an emitted EOS would leave
    # the cache ahead of the text) and the target rejected drafts along the way.
    assert stats.finish_reason == "max_tokens"
    assert stats.drafted > stats.accepted
    context = [*PROMPT, *tokens]

    # The last token is pending: it opens the next verify block.
    assert list(target_model.cached_tokens()) == context[:-1]
    continued = target_model.eval_block(context[-1:], "last")
    np.testing.assert_array_equal(continued, target().eval_block(context, "last"))

    past = draft_backend.n_past
    assert list(draft_backend.cached_tokens()) == context[:past]
    continued = draft_backend.eval_block(context[past:], "last")
    np.testing.assert_array_equal(continued, draft_model().eval_block(context, "last"))


@pytest.mark.parametrize("cfg", [GREEDY, FULL], ids=["greedy", "sampled"])
def test_an_unsure_drafter_stops_early(cfg: SamplingConfig) -> None:
    lengths = {}
    for floor in (0.0, 0.35, 1.01):
        engine = Engine(target(), ModelDrafter(draft_model(), min_confidence=floor))
        stats = Stats()
        emitted(engine, PROMPT, 40, cfg, 6, np.random.default_rng(1), stats)
        lengths[floor] = stats.drafted / stats.verify_steps
    # No floor: every step drafts what γ allows; an impossible floor: at most one token.
    assert lengths[1.01] <= 1.0 < lengths[0.35] < lengths[0.0]
