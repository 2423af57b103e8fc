"""What verifying trees would buy, replayed (localspec.control.replay) on recorded answers: the
n-gram drafter also offers its second continuation, and the engine verifies it beside the
chain where the tree pricing (trees.py) finds it pays on the machine's cost curve, or always
(the tree's whole gain, bought at any price). A tree pass of n nodes costs what the curve says
a pass of n tokens costs: the same rows with another mask (benchmarks/tree_replay.py
measures that on the real model). Greedy answers only, as in the chain replay.

A drafter that reads the target's layers (an EAGLE-3 head's top-2, a DFlash block's top-k) is
replayed as GuessingHead: right with a set probability per guess, its runner-up right with
another where it misses, each guess costing it a set share of a target step
(replay_head_tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from localspec.control.calibrate import Calibration
from localspec.control.factory import model_policy, ngram_policy
from localspec.control.replay import Clock, ReplayTarget, Truth
from localspec.control.trees import TreePricing
from localspec.core.engine import Engine
from localspec.core.protocol import Backend, Capabilities, Draft
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Stats
from localspec.drafters.ngram import NgramDrafter


class TreeReplayTarget(ReplayTarget):
    """A replay target that takes trees: every node's choice is the recorded token after its
    depth (the acceptance never passes a node off the recorded text, so no row below one is read)."""

    def __init__(
        self, text: Sequence[int], truth: Truth, clock: Clock, n_vocab: int, repass: bool = False, fold: bool = False
    ) -> None:
        super().__init__(text, truth, clock, n_vocab)
        self.capabilities = Capabilities(
            max_block=512, device="cpu", branches=16, repasses_branch=repass, folds_branch=fold
        )
        self._open: tuple[int, list[int]] = (0, [])
        self._parents: list[int] = []
        self._folded = 0  # a kept branch's tokens that the next pass evaluates first (fold)

    def _charge_folded(self, rows: int) -> None:
        """The rows a kept branch adds to this pass of `rows` (fold): the pass's price with them
        less its price without."""
        folded, self._folded = self._folded, 0
        if folded:
            past = len(self._tokens)
            extra = self.truth.seconds(rows + folded, past, self.last) - self.truth.seconds(rows, past, self.last)
            self.clock.simulated += max(extra, 0.0)

    def eval_block(self, tokens: Sequence[int], logits: str = "all") -> np.ndarray:
        self._charge_folded(len(tokens))
        return super().eval_block(tokens, logits)

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        self._charge_folded(len(tokens))
        past = len(self._tokens)
        self.clock.simulated += self.truth.seconds(len(tokens), past, self.last)
        self.last = len(tokens)
        out = np.zeros((len(tokens), self.n_vocab), dtype=np.float32)
        depth = [0] * len(tokens)
        for row in range(1, len(tokens)):
            depth[row] = depth[parents[row]] + 1
        for row in range(len(tokens)):
            nxt = past + depth[row] + 1
            out[row, self.text[nxt] if nxt < len(self.text) else 0] = 1.0
        self._tokens.append(tokens[0])
        self._open, self._parents = (past, list(tokens)), list(parents)
        return out

    def keep_branch(self, path: Sequence[int]) -> None:
        past, nodes = self._open
        self._tokens[past:] = [nodes[i] for i in path]
        # A backend that evaluates a kept path's part off the chain again (llama.cpp's
        # keep_branch) pays a pass of that many tokens more, or as many rows more in the next
        # pass where it folds them into it.
        chain = next((i for i in range(1, len(self._parents)) if self._parents[i] != i - 1), len(self._parents))
        off = sum(1 for node in path if node >= chain)
        if off and self.capabilities.folds_branch:
            self._folded = off  # priced with the next pass
        elif off and self.capabilities.repasses_branch:
            self.clock.simulated += self.truth.seconds(off, past + len(path) - off, self.last)
            self.last = off


class CountedPricing(TreePricing):
    """TreePricing that counts its tree steps and the steps a branch was taken."""

    trees: int = 0
    taken: int = 0

    def observe_tree(self, chain: int, heads: Sequence[tuple[int, int]], path: Sequence[int]) -> None:
        self.trees += 1
        self.taken += any(node >= chain for node in path)
        super().observe_tree(chain, heads, path)


class EveryBranch(CountedPricing):
    """Verifies every branch offered: what trees buy whatever they cost."""

    def shape(
        self, chain: int, support: int, offered: Sequence[tuple[int, Sequence[int]]], depth: int
    ) -> list[tuple[int, list[int]]]:
        room, out = self.most_nodes() - chain, []
        for d, branch in offered:
            out.append((d, list(branch[: max(room, 0)])))
            room -= len(out[-1][1])
        return [b for b in out if b[1]]


@dataclass(frozen=True)
class TreeRun:
    seconds: float
    steps: int
    trees: int  # steps that verified a tree
    taken: int  # steps whose kept path went through a branch


def replay_tree(
    prompt: list[int],
    answer: list[int],
    calibration: Calibration,
    n_vocab: int,
    mode: str = "priced",
    repass: bool = False,
    fold: bool = False,
) -> TreeRun:
    """Simulated seconds of n-gram drafting under the adaptive policy: mode "chain" (no
    trees), "priced" (TreePricing decides per step) or "always" (every branch verified).
    The policy learns on a curve of its own, the clock keeps the calibration's. repass: the
    target evaluates a kept branch again (llama.cpp), which the clock and the pricing charge;
    fold: at the head of the next pass rather than in a pass of its own."""
    clock, truth = Clock(), Truth.of(calibration)
    target = TreeReplayTarget(prompt + answer, truth, clock, n_vocab, repass, fold)
    drafter = NgramDrafter(branching=int(mode != "chain"))
    policy = ngram_policy(calibration.cost_curve())
    pricing = (EveryBranch if mode == "always" else CountedPricing)(policy, repass=repass, fold=fold)
    trees = pricing if mode != "chain" else None
    engine = Engine(cast(Backend, target), drafter, free_drafter=True, clock=clock, trees=trees)
    stats, produced = Stats(), list[int]()
    cfg = SamplingConfig(temperature=0.0)
    for step in engine.generate(prompt, len(answer), cfg, policy, stats, np.random.default_rng(0)):
        produced.extend(step.tokens)
    if produced != answer:
        raise AssertionError("the tree replay diverged from the recorded answer")
    return TreeRun(stats.decode_seconds, stats.verify_steps, pricing.trees, pricing.taken)


@dataclass(frozen=True)
class HeadModel:
    """What a simulated head guesses: each guess is the recorded token with probability
    `alpha` until its first miss, a miss's runner-up (a branch where branching) is the
    recorded token with probability `beta`, and a guess costs `cost` of a target step."""

    alpha: float = 0.6
    beta: float = 0.4
    cost: float = 0.05


class GuessingHead:
    """A head drafting on a recorded answer (HeadModel), offering its runner-up at its first
    `branching` positions as ModelDrafter does for an EAGLE-3 head."""

    name = "draft"
    off_notice: str | None = None

    def __init__(
        self, text: Sequence[int], model: HeadModel, seconds: float, clock: Clock, n_vocab: int, branching: int = 0
    ) -> None:
        self.text, self.model, self.seconds, self.clock, self.n_vocab = list(text), model, seconds, clock, n_vocab
        self.branching = branching
        self.seed = 0

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        at, on = len(context), True
        tokens: list[int] = []
        branches: list[tuple[int, list[int]]] = []
        for i in range(max(0, min(n, len(self.text) - at))):
            truth = self.text[at + i]
            # Drawn per position, so a replay with branches guesses what one without does.
            first, second = np.random.default_rng((self.seed, at + i)).random(2)
            right = on and first < self.model.alpha
            tokens.append(truth if right else (truth + 1) % self.n_vocab)
            if i < self.branching:  # the runner-up: the recorded token where the guess missed, sometimes
                runner_up = on and not right and second < self.model.beta
                branches.append((i, [truth if runner_up else (truth + 2) % self.n_vocab]))
            on = right
        self.clock.simulated += self.seconds * len(tokens)
        return Draft(tokens, branches=branches or None)

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        return None

    def backlog(self, context: Sequence[int]) -> int:
        return 0

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        return None

    def close(self) -> None:
        return None


def replay_head_tree(
    prompt: list[int],
    answer: list[int],
    calibration: Calibration,
    n_vocab: int,
    head: HeadModel,
    mode: str = "priced",
    repass: bool = True,
    fold: bool = True,
) -> TreeRun:
    """replay_tree with a simulated head (GuessingHead) instead of the n-gram drafter, priced
    as a model drafter of that agreement and cost. repass and fold: as llama.cpp's target
    (fold where a kept branch's rows come from the tree pass; without fold, as it was where a
    drafter read the target's layers, a pass of its own)."""
    clock, truth = Clock(), Truth.of(calibration)
    target = TreeReplayTarget(prompt + answer, truth, clock, n_vocab, repass, fold)
    step = truth.seconds(1, len(prompt), 1)
    branching = 2 * int(mode != "chain")
    drafter = GuessingHead(prompt + answer, head, head.cost * step, clock, n_vocab, branching)
    policy = model_policy(calibration.cost_curve(), head.cost * step, head.alpha)
    pricing = (EveryBranch if mode == "always" else CountedPricing)(policy, repass=repass, fold=fold)
    trees = pricing if mode != "chain" else None
    engine = Engine(cast(Backend, target), drafter, clock=clock, trees=trees)
    stats, produced = Stats(), list[int]()
    cfg = SamplingConfig(temperature=0.0)
    for step_ in engine.generate(prompt, len(answer), cfg, policy, stats, np.random.default_rng(0)):
        produced.extend(step_.tokens)
    if produced != answer:
        raise AssertionError("the head tree replay diverged from the recorded answer")
    return TreeRun(stats.decode_seconds, stats.verify_steps, pricing.trees, pricing.taken)
