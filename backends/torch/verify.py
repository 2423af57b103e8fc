"""The acceptance rules on torch tensors, where the logits are: one implementation for CPU and
CUDA tensors, so a GPU step sends the host two integers instead of a full-vocabulary logit
row per position.

localspec.core.sampling and localspec.core.acceptance (numpy) are the reference: the same chain
(min-p -> top-k -> top-p on raw logits, then temperature), the same greedy rule (argmax, the
first one on ties, as numpy's) and the same rejection sampling; the random numbers are the
request's numpy generator's, drawn on the host up front (k + 1 of them), so a seed means
the same thing on every device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from localspec.core.sampling import Distribution, SamplingConfig


def accept_greedy(draft: Sequence[int], logits: torch.Tensor) -> tuple[int, int]:
    """Keep the longest prefix of the draft that equals the target's argmax at each position."""
    k = len(draft)
    block = torch.tensor([0, *draft], dtype=torch.long).to(logits.device, non_blocking=True)
    n_acc, token = greedy_outcome(logits[: k + 1], block).tolist()
    return int(n_acc), int(token)


def greedy_outcome(logits: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """[accepted, next token] as a device tensor, from a verify block's logits [n, vocab] and
    its tokens [n] (the pending token, then the draft). Nothing here waits on the host, so a
    CUDA graph can hold it after the forward pass (cuda.py's "greedy" steps)."""
    choice = torch.argmax(logits, dim=-1)
    kept = (choice[:-1] == block[1:]).to(torch.int64)
    n = torch.cumprod(kept, 0).sum().view(1)  # the leading run of matches
    return torch.cat([n, choice.gather(0, n)])


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """[n, vocab] logits -> [n, vocab] float64 probabilities: sampling.process per row, dense."""
    vocab = logits.shape[-1]
    k = cfg.top_k if 0 < cfg.top_k < vocab else vocab
    # Sorting float32 values orders them as their float64 copies would (the cast is exact).
    vals32, ids = torch.topk(logits, k, dim=-1, sorted=True)
    vals = vals32.to(torch.float64)
    shifted = vals - vals[:, :1]
    keep = torch.ones_like(vals, dtype=torch.bool)
    if cfg.min_p > 0:
        # p_i / p_max >= min_p  <=>  logit_i >= logit_max + log(min_p); survivors are a prefix
        keep &= shifted >= math.log(cfg.min_p)
    if cfg.top_p < 1:
        # The smallest prefix whose mass reaches top_p: rank r stays iff the mass before it is
        # below top_p (with sampling.process's rounding tolerance).
        p = torch.exp(shifted) * keep
        cdf = torch.cumsum(p, -1) / p.sum(-1, keepdim=True)
        before = torch.cat([torch.zeros_like(cdf[:, :1]), cdf[:, :-1]], -1)
        keep &= before < cfg.top_p - 1e-9
    scaled = torch.exp(shifted / cfg.temperature) * keep
    probs = scaled / scaled.sum(-1, keepdim=True)
    return torch.zeros(logits.shape, dtype=torch.float64, device=logits.device).scatter_(-1, ids, probs)


def draft_probabilities(
    draft: Sequence[int], dists: Sequence[Distribution] | None, vocab: int, device: torch.device
) -> torch.Tensor:
    """The drafter's q as [k + 1, vocab] float64 with a zero last row (a full acceptance's bonus
    token then comes from max(0, p - 0) = p); a drafter without distributions is one-hot."""
    k = len(draft)
    if dists is None:
        rows, ids, probs = np.arange(k), np.asarray(draft, dtype=np.int64), np.ones(k)
    else:
        none = [np.zeros(0, dtype=np.int64)]
        rows = np.concatenate([np.full(d.ids.size, i, dtype=np.int64) for i, d in enumerate(dists[:k])] or none)
        ids = np.concatenate([d.ids for d in dists[:k]] or none)
        probs = np.concatenate([d.probs for d in dists[:k]] or [np.zeros(0)])
    flat = torch.from_numpy((rows * vocab + ids).astype(np.int64)).to(device, non_blocking=True)
    values = torch.from_numpy(probs.astype(np.float64)).to(device, non_blocking=True)
    q = torch.zeros((k + 1) * vocab, dtype=torch.float64, device=device)
    return q.index_put_((flat,), values).view(k + 1, vocab)


def accept_rejection_sampling(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution] | None,
    logits: torch.Tensor,
    cfg: SamplingConfig,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023), every position at once.

    Token x_i ~ q_i is kept iff u_i · q_i(x_i) < p_i(x_i) (probability min(1, p/q)); the first
    position that fails is n, and the emitted token comes from norm(max(0, p_n - q_n)), which
    is p_k itself after a full acceptance (q_k = 0). The output is distributed exactly as p.
    """
    k = len(draft)
    device = logits.device
    uniforms = torch.from_numpy(rng.random(k + 1)).to(device, non_blocking=True)
    p = probabilities(logits[: k + 1], cfg)
    q = draft_probabilities(draft, draft_dists, logits.shape[-1], device)
    proposed = torch.tensor(draft, dtype=torch.long).to(device, non_blocking=True)
    positions = torch.arange(k, device=device)
    qx, px = q[positions, proposed], p[positions, proposed]
    kept = (qx > 0) & (uniforms[:k] * qx < px)
    n = torch.cumprod(kept.to(torch.int64), 0).sum() if k else torch.zeros((), dtype=torch.long, device=device)
    row_p, row_q = p[n], q[n]
    residual = torch.clamp(row_p - row_q, min=0.0)
    total = residual.sum()
    # p == q up to rounding: any rejection was a float artefact, so sample from p itself.
    dist = torch.where(total > 1e-12, residual / total.clamp_min(1e-300), row_p)
    cdf = torch.cumsum(dist, 0)
    token = torch.searchsorted(cdf, uniforms[k:] * cdf[-1:], right=True).clamp_(max=cdf.numel() - 1)
    n_acc, nxt = torch.cat([n.view(1), token]).tolist()
    return int(n_acc), int(nxt)


def accept(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution] | None,
    logits: torch.Tensor,
    cfg: SamplingConfig,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """The engine's rule for a verify block's logits [len(draft) + 1, vocab]: greedy or sampled."""
    if cfg.greedy:
        return accept_greedy(draft, logits)
    return accept_rejection_sampling(draft, draft_dists, logits, cfg, rng)
