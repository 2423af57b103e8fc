"""The acceptance rules on torch tensors (backends/torch/verify.py) against the numpy reference.

CI has no GPU, so the device code runs here on CPU tensors: the same functions a CUDA backend
calls. Greedy must pick exactly what localspec.core.acceptance picks; sampling must follow the
target's law (the chi-square harness of test_exactness, through the real Engine).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend tests need PyTorch: pip install 'localspec[torch]'")

from test_exactness import (  # noqa: E402
    DRAFT_NOISE,
    FULL,
    GREEDY_PROMPTS,
    GREEDY_VOCAB,
    N_RUNS,
    PROMPT,
    TRUNCATED,
    VOCAB,
    chi_square_pvalue,
    emitted,
    exact_joint,
    greedy_tokens,
    outcome,
    plain_decoding,
    run_rng,
)
from test_torch_tiny_models import SMALL, tiny  # noqa: E402

from localspec.backends.reference import ReferenceBackend  # noqa: E402
from localspec.backends.torch import verify  # noqa: E402
from localspec.core import acceptance  # noqa: E402
from localspec.core.engine import Engine  # noqa: E402
from localspec.core.sampling import Distribution, SamplingConfig, process  # noqa: E402
from localspec.core.stats import Stats  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402
from localspec.drafters.ngram import NgramDrafter  # noqa: E402


class TorchVerified(ReferenceBackend):
    """The reference backend whose verify steps go through verify.py on CPU tensors."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size, seed=0)
        self.capabilities = replace(self.capabilities, verifies=True)
        self.verified = 0

    def verify_block(
        self,
        tokens: Sequence[int],
        draft_dists: Sequence[Distribution] | None,
        cfg: SamplingConfig,
        rng: np.random.Generator,
    ) -> tuple[int, int]:
        self.verified += 1
        logits = torch.from_numpy(np.array(self.eval_block(tokens, "all"), dtype=np.float32))
        return verify.accept(tokens[1:], draft_dists, logits, cfg, rng)


CONFIGS = [
    FULL,
    TRUNCATED,
    SamplingConfig(temperature=1.3, top_k=3, top_p=1.0, min_p=0.0),
    SamplingConfig(temperature=0.5, top_k=0, top_p=0.6, min_p=0.0),
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["full", "truncated", "top-k", "top-p", "min-p"])
def test_the_logit_chain_gives_the_numpy_chains_distribution(cfg: SamplingConfig) -> None:
    logits = np.random.default_rng(3).normal(0, 3, size=(9, 500)).astype(np.float32)
    dense = verify.probabilities(torch.from_numpy(logits), cfg).numpy()
    for row, got in zip(logits, dense, strict=True):
        np.testing.assert_allclose(got, process(row, cfg).dense(500), rtol=1e-12, atol=1e-15)


def test_greedy_acceptance_picks_what_numpy_picks_ties_included() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        k = int(rng.integers(0, 9))
        # Few distinct values: ties for the argmax are common, and the first one must win.
        logits = rng.integers(0, 4, size=(k + 1, 7)).astype(np.float32)
        draft = rng.integers(0, 7, size=k).tolist()
        choice = np.argmax(logits, axis=1)
        draft = [int(c) if rng.random() < 0.7 else d for c, d in zip(choice, draft, strict=False)]
        assert verify.accept_greedy(draft, torch.from_numpy(logits)) == acceptance.accept_greedy(draft, logits)


def test_a_point_mass_draft_is_kept_iff_its_uniform_is_below_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-30], [0.1, 0.1, 0.1, 0.7]]))
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    runs = [verify.accept_rejection_sampling([1], None, logits, cfg, np.random.default_rng(i)) for i in range(4000)]
    kept = Counter(n for n, _ in runs)
    assert abs(kept[1] / 4000 - 0.3) < 0.03
    # A rejected point mass is replaced by a draw from p without it: never token 1 again.
    assert (0, 1) not in set(runs)


@pytest.mark.parametrize("cfg", [FULL, TRUNCATED], ids=["full", "truncated"])
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_sampled_speculation_verified_in_torch_follows_the_target_law(drafter: str, cfg: SamplingConfig) -> None:
    target = TorchVerified(VOCAB)
    draft = (
        NgramDrafter(min_ngram=1)
        if drafter == "ngram"
        else ModelDrafter(ReferenceBackend(vocab_size=VOCAB, seed=0, noise=DRAFT_NOISE), min_confidence=0.0)
    )
    engine = Engine(target, draft)
    observed: Counter[tuple[int, int]] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        observed[outcome(emitted(engine, PROMPT, 4, cfg, 3, run_rng(run), stats, enough=2))] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert target.verified > 0 and drafted > accepted > 0
    assert chi_square_pvalue(observed, exact_joint(ReferenceBackend(vocab_size=VOCAB, seed=0), PROMPT, cfg)) > 1e-3


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_greedy_speculation_verified_in_torch_reproduces_plain_decoding(drafter: str) -> None:
    target = TorchVerified(GREEDY_VOCAB)
    draft = (
        NgramDrafter(min_ngram=1)
        if drafter == "ngram"
        else ModelDrafter(ReferenceBackend(vocab_size=GREEDY_VOCAB, seed=0, noise=DRAFT_NOISE), 0.0)
    )
    engine = Engine(target, draft)
    for prompt in GREEDY_PROMPTS:
        assert greedy_tokens(engine, prompt, 4, Stats()) == plain_decoding(prompt)
    assert target.verified > 0


def test_the_torch_backend_verifies_on_its_device_when_asked(models) -> None:
    target = tiny(str(models(SMALL)), verify_on_device=True)
    plain = tiny(str(models(SMALL)))
    assert target.capabilities.verifies and not plain.capabilities.verifies  # on by default on CUDA only
    prompt = [40, 41, 42, 43, 40, 41, 42, 43, 40, 41]
    rng = np.random.default_rng(0)
    greedy = SamplingConfig(temperature=0.0)
    on_device = emitted(Engine(target, NgramDrafter(min_ngram=1)), prompt, 30, greedy, 4, rng, Stats())
    on_host = emitted(Engine(plain, NgramDrafter(min_ngram=1)), prompt, 30, greedy, 4, rng, Stats())
    assert on_device == on_host
    # The cache holds the committed text, the pending token excepted, as after eval_block.
    assert list(target.cached_tokens()) == [*prompt, *on_device][:-1]
