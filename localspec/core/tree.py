"""A tree of guesses verified in one target pass (SpecInfer, EAGLE-2, Medusa, DDTree).

A drafter's chain gets branches: other candidates for one of its positions (the top-2 of a
draft model's distribution, a second n-gram continuation, a block drafter's per-position
top-k), each hanging from the chain token before that position. The target evaluates every
node once, each behind its own root path, and the step keeps the longest root path it
agrees with:

- greedy: at each node, the child equal to the target's argmax (none: the argmax itself);
- seeded: the same with the target's keyed draw at that position (accept_seeded);
- sampling: multi-candidate rejection sampling. At a node with target law p, child x drawn
  from q is kept with probability min(1, p(x)/q(x)); on rejection p becomes
  norm(max(0, p - q)) and the next child is tried against it; with no child kept, the token
  is drawn from what p has become. Each round is one exact speculative-sampling step for the
  law it is given, so the emitted token follows the target's law whatever the children were,
  as long as each child was drawn (or fixed) before any acceptance coin was thrown. A child
  without a distribution (a lookup's guess, a branch's token) is a point mass: kept with
  probability p(x), and p loses x otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from localspec.core.acceptance import residual
from localspec.core.proposal import Proposal
from localspec.core.sampling import Distribution, SamplingConfig, one_hot, process

Rows = npt.NDArray[np.floating]


def grow(proposal: Proposal, branches: Sequence[tuple[int, Sequence[int]]]) -> Proposal:
    """The proposal's chain with branches added: a branch at depth d hangs from chain token
    d-1 (from the pending token for d = 0) and runs on as a chain of its own. A branch whose
    first token the chain or an earlier branch already guesses there is left out."""
    chain = proposal.tokens
    tokens, parents = list(chain), list(range(-1, len(chain) - 1))
    dists = list(proposal.dists) if proposal.dists is not None else None
    taken = {(d - 1, t) for d, t in enumerate(chain)}
    for depth, branch in branches:
        parent = depth - 1
        if not branch or depth >= len(chain) or (parent, branch[0]) in taken:
            continue
        taken.add((parent, branch[0]))
        for tok in branch:
            tokens.append(int(tok))
            parents.append(parent)
            parent = len(tokens) - 1
            if dists is not None:
                dists.append(one_hot(int(tok)))
    if len(tokens) == len(chain):
        return proposal
    return replace(proposal, tokens=tokens, dists=dists, parents=tuple(parents))


def top_k_branches(chain: Sequence[int], top_k: Sequence[Sequence[int]]) -> list[tuple[int, list[int]]]:
    """Draft.branches from a block drafter's per-position top-k (DFlash's, a Medusa head's):
    every candidate at position d other than the chain's own token, as a one-token branch at
    depth d, likeliest first. Each is a fixed guess, so the acceptance rule takes it as a
    point mass; the tree pricing (localspec.control.trees) keeps those that pay."""
    return [(d, [int(t)]) for d, cands in enumerate(top_k[: len(chain)]) for t in cands if t != chain[d]]


def alternatives(row: npt.NDArray[np.floating], tok: int, dist: Distribution | None, k: int) -> list[int]:
    """The k likeliest tokens other than tok, likeliest first: a drafter's runner-ups at a
    position, each a fixed guess (a point mass to the acceptance rule whatever tok's law was).
    Ranked by the law tok was drawn from where there is one (a token outside it the target
    never keeps either), else by the raw row."""
    scores, ids = (dist.probs, dist.ids) if dist is not None else (row, None)
    m = min(k + 1, scores.size)
    if m <= 0:
        return []
    top = np.argpartition(scores, -m)[-m:]  # the likeliest m, in no order: no sort of the vocabulary
    ranked = top[np.argsort(-scores[top], kind="stable")]
    cands = ids[ranked] if ids is not None else ranked
    return [int(t) for t in cands if t != tok][:k]


def children(parents: Sequence[int]) -> list[list[int]]:
    """Row r's children (row 0: the pending token, row i + 1: node i), in node order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        kids[parent + 1].append(node)
    return kids


def branch_heads(parents: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
    """A grown tree's chain length, and each branch's depth and first node (grow's layout:
    the chain first, then each branch's nodes in a run)."""
    chain = next((i for i, p in enumerate(parents) if p != i - 1), len(parents))
    heads = [(parents[i] + 1, i) for i in range(chain, len(parents)) if parents[i] != i - 1 or i == chain]
    return chain, heads


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 0 where its parent is -1 (the pending token's children in a
    Proposal; the root itself in a backend's tree, whose row 0 is the pending token)."""
    out: list[int] = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return out


def root_path(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the pending token's child down to node."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def accept_tree(
    proposal: Proposal, logits: Rows, cfg: SamplingConfig, rng: np.random.Generator, position: int
) -> tuple[list[int], int]:
    """The accepted root path (node indices) and the token the target adds after it. logits:
    row 0 for the pending token (at context position `position` - 1), row i + 1 for node i."""
    assert proposal.parents is not None
    tokens, kids = proposal.tokens, children(proposal.parents)
    if cfg.greedy:
        return _walk(tokens, kids, lambda row, _: int(np.argmax(logits[row])))
    if cfg.seed is not None:
        seed = cfg.seed
        return _walk(tokens, kids, lambda row, depth: process(logits[row], cfg).keyed_sample(seed, position + depth))
    return accept_tree_sampling(tokens, kids, proposal.dists, logits, cfg, rng)


def _walk(tokens: Sequence[int], kids: list[list[int]], pick: Callable[[int, int], int]) -> tuple[list[int], int]:
    """From the pending token down: the child equal to the target's pick, while there is one."""
    path: list[int] = []
    row = 0
    while True:
        chosen = pick(row, len(path))
        child = next((c for c in kids[row] if tokens[c] == chosen), None)
        if child is None:
            return path, chosen
        path.append(child)
        row = child + 1


def accept_tree_sampling(
    tokens: Sequence[int],
    kids: list[list[int]],
    dists: Sequence[Distribution] | None,
    logits: Rows,
    cfg: SamplingConfig,
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """Multi-candidate rejection sampling down the tree (the module's docstring)."""
    path: list[int] = []
    row = 0
    while True:
        p = process(logits[row], cfg)
        for child in kids[row]:
            x = tokens[child]
            q = dists[child] if dists is not None else one_hot(x)
            qx = q.prob(x)
            if qx > 0 and rng.random() * qx < p.prob(x):
                path.append(child)
                row = child + 1
                break
            p = residual(p, q)
        else:
            return path, p.sample(rng)
