"""Deciding how much of a draft the target keeps. Both functions return
(number of draft tokens accepted, the token the target adds after them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from localspec.core.sampling import Distribution, SamplingConfig, one_hot, process


def accept_greedy(draft: Sequence[int], target_logits: npt.NDArray[np.floating]) -> tuple[int, int]:
    """Keep the longest prefix of the draft that equals the target's argmax at each position."""
    return accept_picks(draft, np.argmax(target_logits[: len(draft) + 1], axis=1).tolist())


def accept_picks(draft: Sequence[int], picks: Sequence[int]) -> tuple[int, int]:
    """accept_greedy from the argmax of each row (picks[i], where a backend computed it)."""
    n = 0
    for proposed in draft:
        if picks[n] != proposed:
            break
        n += 1
    return n, picks[n]


def accept_rejection_sampling(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution] | None,
    target_logits: npt.NDArray[np.floating],
    cfg: SamplingConfig,
    rng: np.random.Generator,
    refused: Distribution | None = None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

    Token x ~ q is kept with probability min(1, p(x)/q(x)); on rejection the replacement is
    drawn from norm(max(0, p - q)); after a fully accepted draft a bonus token comes from p.
    The output is then distributed exactly as p. A drafter with no distribution (n-gram) is
    a point mass: acceptance becomes p(x), the residual is p without x, which is the same
    law as "sample from p and keep the draft iff they agree".

    refused: the draft's distribution one position past the draft, whose drafted token the
    target cannot take (an id beyond its vocabulary, so p = 0 there): that token counts as
    drafted and rejected, so the token after a fully kept draft comes from the residual.
    """
    for i, x in enumerate(draft):
        p = process(target_logits[i], cfg)
        q = draft_dists[i] if draft_dists is not None else one_hot(x)
        px, qx = p.prob(x), q.prob(x)
        if qx > 0 and rng.random() * qx < px:
            continue
        return i, _sample_residual(p, q, rng)
    last = process(target_logits[len(draft)], cfg)
    return len(draft), (last.sample(rng) if refused is None else _sample_residual(last, refused, rng))


def _sample_residual(p: Distribution, q: Distribution, rng: np.random.Generator) -> int:
    return residual(p, q).sample(rng)


def residual(p: Distribution, q: Distribution) -> Distribution:
    """norm(max(0, p - q)): what a token rejected against q is drawn from instead."""
    ids = np.union1d(p.ids, q.ids)
    pd = np.zeros(ids.size)
    qd = np.zeros(ids.size)
    pd[np.searchsorted(ids, p.ids)] = p.probs
    qd[np.searchsorted(ids, q.ids)] = q.probs
    rest = np.maximum(pd - qd, 0.0)
    total = rest.sum()
    if total <= 1e-12:  # p == q up to rounding: any rejection was a float artefact
        return p
    return Distribution(ids, rest / total)


def accept_seeded(
    draft: Sequence[int], target_logits: npt.NDArray[np.floating], cfg: SamplingConfig, seed: int, position: int
) -> tuple[int, int]:
    """A seeded request's rule, where the answer must be the same whatever was drafted.

    The target's token at context position k is p_k's Gumbel-max draw with noise keyed by
    (seed, k) (Distribution.keyed_sample); draft tokens are kept while they equal it. Each
    emitted token is then p's own draw given the text before it, as plain sampling with
    that seed makes it: the draft only decides how many positions one pass settles. A draft
    model draws its tokens with the same noise, so it is kept wherever its law leads to the
    target's token; a point-mass drafter (n-gram, memory) is kept with probability p(x), as
    under rejection sampling. `position`: the context position of the first row's token."""
    for i in range(len(draft) + 1):
        chosen = process(target_logits[i], cfg).keyed_sample(seed, position + i)
        if i == len(draft) or chosen != draft[i]:
            return i, chosen
    raise AssertionError("unreachable: the loop returns at i == len(draft)")
