"""Which branches a step verifies beside its chain: a tree is priced by its node count on the
policy's cost curve (a tree pass over n nodes costs what a chain pass over n tokens does:
the same rows, another mask), against the tokens its branches are expected to add.

A branch at depth d adds tokens only where the chain reaches d and its token there is wrong:

    gain(branch) = Π_{i<d} α_i · (1 - α_d) · β_d · (1 + Σ_{j≥1} Π_{i≤j} α_{d+i})

with α the policy's acceptance chain and β_d the measured share of tried branches at depth d
whose first token the target took (learnt here from every tree step). Branches are taken in
order of gain per node while the predicted rate, tokens over the pass's price, beats the
chain's by `margin`. On a CPU a pass costs more with every row, so a branch rarely pays
there; on a GPU, where a pass of 20 rows costs about what one of 2 does, most do.

A kept branch off the tree's first sequence is evaluated again on llama.cpp (repass), at the
head of the next pass (fold): its price is the rows it adds there, also where a drafter reads
the target's layers (the kept path's rows come from the tree pass itself).

For experiments and tests a tree can be asked for instead of priced (TreeAsk): every
branch the drafters offer at their first few positions, whatever the curve says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from localspec.control.policy import AdaptiveDraftLength
from localspec.core.choices import TreeAsk as TreeAsk  # asked for by name with the shaper that serves it
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend, Capabilities

# Depths past the last one share its estimate; a branch deep in a chain is seldom tried.
DEPTHS = 4
# The first positions of a draft whose runner-up a draft model offers as a branch.
BRANCHING = 2


@dataclass
class TreePricing:
    """localspec.core.protocol.TreeShaper over an adaptive draft-length policy."""

    policy: AdaptiveDraftLength
    prior: float = 0.3  # β before evidence: how often a second guess is right where the first was not
    prior_weight: float = 4.0  # observations the prior is worth
    margin: float = 0.02  # a tree must beat its chain's predicted rate by this share
    max_nodes: int = 22  # the most guessed tokens one tree holds (DDTree's largest)
    memory: float = 100.0  # observations the estimates remember
    # The backend evaluates a kept branch again (Capabilities.repasses_branch): each branch
    # also costs, where it is taken, a pass over its tokens, or with fold
    # (Capabilities.folds_branch) as many rows more in the next pass.
    repass: bool = False
    fold: bool = False
    hits: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    trials: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)

    def most_nodes(self) -> int:
        """The largest tree priced: max_nodes, within the pass sizes the curve measured (past
        them it is extrapolated, which a chain never needs)."""
        return min(self.max_nodes, len(self.policy.costs.verify_seconds) - 1)

    def beta(self, depth: int) -> float:
        i = min(depth, DEPTHS - 1)
        return (self.prior * self.prior_weight + self.hits[i]) / (self.prior_weight + self.trials[i])

    def shape(
        self, chain: int, support: int, offered: Sequence[tuple[int, Sequence[int]]], depth: int
    ) -> list[tuple[int, list[int]]]:
        alpha = self.policy.chain(chain, support)
        reach = [1.0]
        for a in alpha:
            reach.append(reach[-1] * a)
        candidates = []
        for d, branch in offered:
            if d >= chain or not branch:
                continue
            tokens, gain = self._trim(d, list(branch), alpha, reach)
            taken = reach[d] * (1.0 - alpha[d]) * self.beta(d)
            extra = taken * self._again(chain, len(tokens), depth) if self.repass else 0.0
            candidates.append((gain / len(tokens), d, tokens, gain, extra))
        expected, nodes, repass = self.policy.expected_tokens(chain, support), chain, 0.0
        rate = expected / self.policy.costs.verify(nodes + 1, depth)
        chosen: list[tuple[int, list[int]]] = []
        for _, d, tokens, gain, extra in sorted(candidates, key=lambda c: -c[0]):
            if nodes + len(tokens) > self.most_nodes():
                continue
            wider = (expected + gain) / (self.policy.costs.verify(nodes + len(tokens) + 1, depth) + repass + extra)
            if wider > rate * (1.0 + self.margin):
                chosen.append((d, tokens))
                expected, nodes, rate, repass = expected + gain, nodes + len(tokens), wider, repass + extra
        return chosen

    def _again(self, chain: int, n: int, depth: int) -> float:
        """What evaluating a kept branch's n tokens again costs: a pass of its own, or with fold
        the rows they add to the next pass (priced as one over this step's chain)."""
        costs = self.policy.costs
        if not self.fold:
            return costs.verify(n, depth)
        return max(costs.verify(chain + 1 + n, depth) - costs.verify(chain + 1, depth), 0.0)

    def _trim(self, d: int, branch: list[int], alpha: list[float], reach: list[float]) -> tuple[list[int], float]:
        """The branch cut where its next token is less likely right than wrong, and its gain."""
        head = reach[d] * (1.0 - alpha[d]) * self.beta(d)
        gain, run, keep = head, head, 1
        for j in range(1, len(branch)):
            a = alpha[min(d + j, len(alpha) - 1)]
            if a < 0.5:
                break
            run *= a
            gain, keep = gain + run, j + 1
        return branch[:keep], gain

    def observe_tree(self, chain: int, heads: Sequence[tuple[int, int]], path: Sequence[int]) -> None:
        # A branch at depth d was tried only where the chain's tokens before d were kept and
        # the one at d was not; siblings are tried in node order until one is kept.
        reached = sum(1 for node in path if node < chain)
        keep = 1.0 - 1.0 / self.memory
        for d, node in heads:
            if d != reached:
                continue
            hit = len(path) > reached and path[reached] == node
            i = min(d, DEPTHS - 1)
            self.hits[i] = self.hits[i] * keep + hit
            self.trials[i] = self.trials[i] * keep + 1.0
            if hit:
                return

    def pays(self) -> bool:
        """Whether a branch beside a model draft's first token would pay on this curve at the
        policy's prior (α 0.5) and this β: where not (a CPU), drafters spare the work of
        offering branches."""
        probe = AdaptiveDraftLength(self.policy.costs, 0.0, max_gamma=4, prior=0.5, config=self.policy.config)
        trial = TreePricing(probe, self.prior, self.prior_weight, self.margin, repass=self.repass, fold=self.fold)
        return bool(trial.shape(4, 0, [(0, [0])], 0))


def priced_trees(capabilities: Capabilities, policy: AdaptiveDraftLength) -> TreePricing | None:
    """The tree pricing of a target with these capabilities, where a tree can pay on this
    machine's cost curve (a target that takes trees, a curve flat enough); None: chains only."""
    pricing = TreePricing(policy, repass=capabilities.repasses_branch, fold=capabilities.folds_branch)
    if capabilities.branches < 2 or not pricing.pays():
        return None
    return pricing


@runtime_checkable
class OffersAlternatives(Protocol):
    """A drafter offering several runner-ups at a branching position (DFlash's top-k)."""

    alternatives: int


@dataclass
class AskedTree:
    """localspec.core.protocol.TreeShaper for a tree asked for, not priced (TreeAsk):
    every branch the drafters offer at their first `positions` draft positions is verified
    beside the chain, up to `max_nodes` guessed tokens, whatever the cost curve says."""

    positions: int = BRANCHING
    max_nodes: int = 22
    steps: int = 0  # tree steps verified
    taken: int = 0  # of them, steps whose kept path went through a branch

    def shape(
        self, chain: int, support: int, offered: Sequence[tuple[int, Sequence[int]]], depth: int
    ) -> list[tuple[int, list[int]]]:
        chosen: list[tuple[int, list[int]]] = []
        nodes = chain
        for d, branch in offered:
            if d < min(chain, self.positions) and branch and nodes + len(branch) <= self.max_nodes:
                chosen.append((d, list(branch)))
                nodes += len(branch)
        return chosen

    def observe_tree(self, chain: int, heads: Sequence[tuple[int, int]], path: Sequence[int]) -> None:
        self.steps += 1
        self.taken += any(node >= chain for node in path)


def asked_tree(target: Backend, ask: TreeAsk) -> AskedTree:
    """The tree shaper of `ask` for `target`, refused where the target verifies chains only."""
    if target.capabilities.branches < 2:
        raise InvalidRequestError(
            f"{target.info.name} verifies chains only (a recurrent model's state follows one branch)",
            "draft chains (the default), or ask for trees on a target without recurrent layers",
        )
    if ask.positions < 1 or ask.alternatives < 1:
        raise InvalidRequestError(
            f"a tree needs 1 position and 1 alternative or more, got {ask.positions} and {ask.alternatives}",
            "ask for positions=1 or more (the first draft positions offering runner-ups)",
        )
    return AskedTree(ask.positions)
