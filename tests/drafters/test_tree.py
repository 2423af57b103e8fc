"""A tree of guesses verified in one pass (localspec.core.tree) on the reference backend, whose
law is known in closed form: the accepted path against a brute-force search of the tree,
sampled output against the target's exact law (chi-square), greedy output against plain
decoding, and the cache after a tree pass against a clean pass's."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from test_exactness import (
    FULL,
    GREEDY,
    N_RUNS,
    PROMPT,
    TRUNCATED,
    Outcome,
    chi_square_pvalue,
    draft_model,
    emitted,
    exact_joint,
    outcome,
    run_rng,
    target,
)

from localspec.backends.reference import ReferenceBackend
from localspec.core.engine import Engine
from localspec.core.proposal import Proposal, Source
from localspec.core.protocol import TreeBackend
from localspec.core.sampling import Distribution, SamplingConfig, process
from localspec.core.stats import Stats
from localspec.core.tree import accept_tree, alternatives, branch_heads, children, grow, root_path, top_k_branches
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter


class EveryBranch:
    """A tree shaper that verifies every branch offered (and records what it was told)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[tuple[int, int]], list[int]]] = []

    def shape(
        self, chain: int, support: int, offered: Sequence[tuple[int, Sequence[int]]], depth: int
    ) -> list[tuple[int, list[int]]]:
        return [(d, list(b)) for d, b in offered]

    def observe_tree(self, chain: int, heads: Sequence[tuple[int, int]], path: Sequence[int]) -> None:
        self.seen.append((chain, list(heads), list(path)))


def random_tree(rng: np.random.Generator, vocab: int, nodes: int) -> tuple[list[int], list[int]]:
    """Tokens and parents of a random tree; siblings carry distinct tokens."""
    tokens: list[int] = []
    parents: list[int] = []
    while len(tokens) < nodes:
        parent = int(rng.integers(-1, len(tokens)))
        taken = {tokens[i] for i, p in enumerate(parents) if p == parent}
        free = [t for t in range(3, vocab) if t not in taken]
        if free:
            tokens.append(int(rng.choice(free)))
            parents.append(parent)
    return tokens, parents


def brute_force_greedy(
    model: ReferenceBackend, context: list[int], tokens: list[int], parents: list[int]
) -> tuple[list[int], int]:
    """Every root path of the tree checked against plain greedy decoding: the longest that
    plain decoding would have produced, and plain decoding's next token after it."""
    best: list[int] = []
    for node in range(len(tokens)):
        path = root_path(parents, node)
        text = list(context)
        for n in path:
            if int(np.argmax(model.exact_probs(text, GREEDY))) != tokens[n]:
                break
            text.append(tokens[n])
        else:
            if len(path) > len(best):
                best = path
    after = [*context, *(tokens[n] for n in best)]
    return best, int(np.argmax(model.exact_probs(after, GREEDY)))


def test_grow_hangs_each_branch_from_the_chain_token_before_its_depth() -> None:
    chain = Proposal([10, 11, 12], None, Source.FREE, gamma=3)
    tree = grow(chain, [(0, [20, 21]), (2, [30]), (1, [11]), (3, [40])])
    # (1, [11]) repeats the chain's own token there; depth 3 has no chain token to stand beside.
    assert tree.tokens == [10, 11, 12, 20, 21, 30]
    assert tree.parents == (-1, 0, 1, -1, 3, 1)
    assert branch_heads(tree.parents) == (3, [(0, 3), (2, 5)])
    assert children(tree.parents) == [[0, 3], [1], [2, 5], [], [4], [], []]
    assert grow(chain, []) is chain  # a chain stays a chain, parents None


def test_a_block_drafters_top_k_becomes_branches_beside_its_chain() -> None:
    # The hook for a block drafter (DFlash): its per-position top-k, the chain its argmaxes.
    chain = [10, 11, 12]
    branches = top_k_branches(chain, [[10, 20, 21], [30, 11], [12], [40, 41]])
    assert branches == [(0, [20]), (0, [21]), (1, [30])]
    tree = grow(Proposal(chain, None, Source.MODEL, gamma=3), branches)
    assert tree.tokens == [10, 11, 12, 20, 21, 30]
    assert tree.parents == (-1, 0, 1, -1, -1, 0)


def test_a_drafters_runner_ups_are_ranked_by_the_law_it_drew_from() -> None:
    row = np.array([0.0, 3.0, 1.0, 2.0, -1.0], dtype=np.float32)
    assert alternatives(row, 1, None, 2) == [3, 2]  # greedy: the raw row, the drafted token left out
    assert alternatives(row, 4, None, 2) == [1, 3]
    law = Distribution(np.array([2, 0, 3]), np.array([0.5, 0.3, 0.2]))  # top-3 of a sampled row
    assert alternatives(row, 2, law, 5) == [0, 3]  # nothing outside the law, however high its logit
    assert alternatives(row, 2, Distribution(np.array([2]), np.array([1.0])), 1) == []


@pytest.mark.parametrize("seed", range(24))
def test_greedy_tree_acceptance_equals_a_brute_force_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = ReferenceBackend(vocab_size=8, seed=seed % 5, sharpness=2.0)
    context = [0, *rng.integers(3, 8, size=3).tolist()]
    tokens, parents = random_tree(rng, 8, int(rng.integers(1, 12)))
    # The target's greedy continuation grafted on half the time, so long paths are accepted too.
    if seed % 2:
        text = list(context)
        for _ in range(3):
            text.append(int(np.argmax(model.exact_probs(text, GREEDY))))
        tokens, parents = [*tokens, *text[-3:]], [*parents, -1, len(tokens), len(tokens) + 1]
        tokens, parents = _distinct_siblings(tokens, parents)
    model.eval_block(context[:-1], "none")
    logits = model.eval_tree([context[-1], *tokens], [-1, *(p + 1 for p in parents)])
    proposal = Proposal(tokens, None, Source.FREE, parents=tuple(parents))
    path, bonus = accept_tree(proposal, logits, GREEDY, rng, len(context))
    assert (path, bonus) == brute_force_greedy(
        ReferenceBackend(vocab_size=8, seed=seed % 5, sharpness=2.0), context, tokens, parents
    )


def _distinct_siblings(tokens: list[int], parents: list[int]) -> tuple[list[int], list[int]]:
    """Drop the later of two siblings with one token (and what hangs below it)."""
    keep: list[int] = []
    index: dict[int, int] = {}
    for node, (tok, parent) in enumerate(zip(tokens, parents, strict=True)):
        if parent >= 0 and parent not in index:
            continue
        if any(parents[k] == parent and tokens[k] == tok for k in keep):
            continue
        index[node] = len(keep)
        keep.append(node)
    out_tokens = [tokens[k] for k in keep]
    out_parents = [index[parents[k]] if parents[k] >= 0 else -1 for k in keep]
    return out_tokens, out_parents


def test_a_tree_pass_gives_each_node_the_rows_of_its_own_root_path() -> None:
    rng = np.random.default_rng(3)
    tokens, parents = random_tree(rng, 12, 10)
    model = target()
    model.eval_block(PROMPT[:-1], "none")
    rows = model.eval_tree([PROMPT[-1], *tokens], [-1, *(p + 1 for p in parents)])
    for node in range(len(tokens)):
        clean = target()
        path = [tokens[n] for n in root_path(parents, node)]
        expected = clean.eval_block([*PROMPT, *path], "all")[-1]
        np.testing.assert_array_equal(rows[node + 1], expected)


def test_the_cache_after_a_tree_pass_holds_the_kept_path_as_a_clean_pass_would() -> None:
    model: TreeBackend = target()
    model.eval_block(PROMPT[:-1], "none")
    tokens, parents = [5, 6, 7, 8, 9], [-1, 0, -1, 2, 3]
    model.eval_tree([PROMPT[-1], *tokens], [-1, *(p + 1 for p in parents)])
    model.keep_branch([0, 3, 4])
    clean = target()
    clean.eval_block([*PROMPT, 7, 8], "none")
    assert list(model.cached_tokens()) == list(clean.cached_tokens())
    np.testing.assert_array_equal(model.eval_block([4], "all"), clean.eval_block([4], "all"))


# The text after "3 4" varies, so the lookup has a second continuation to branch with.
BRANCHING_PROMPT = [0, 4, 7, 3, 5, 4, 7, 7, 6, 4, 7]
PROMPTS = {"model": PROMPT, "ngram": BRANCHING_PROMPT}


def tree_engine(drafter: str) -> tuple[Engine, EveryBranch]:
    if drafter == "model":
        draft = ModelDrafter(draft_model(), min_confidence=0.0)
        draft.branching = 2
    else:
        draft = NgramDrafter(min_ngram=1)
        draft.branching = 1
    engine = Engine(target(), draft, free_drafter=drafter == "ngram")
    shaper = EveryBranch()
    engine.trees = shaper
    return engine, shaper


@pytest.mark.parametrize("cfg", [FULL, TRUNCATED], ids=["full", "truncated"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_first_two_tokens_of_a_tree_follow_the_target_law(drafter: str, cfg: SamplingConfig) -> None:
    engine, shaper = tree_engine(drafter)
    prompt = PROMPTS[drafter]
    observed: Counter[Outcome] = Counter()
    for run in range(N_RUNS):
        observed[outcome(emitted(engine, prompt, 4, cfg, 3, run_rng(run), Stats(), enough=2))] += 1
    branch_kept = sum(1 for chain, heads, path in shaper.seen if any(n >= chain for n in path))
    assert branch_kept > 50  # the branches were really verified and taken
    assert chi_square_pvalue(observed, exact_joint(target(), prompt, cfg)) > 1e-3


def test_seeded_trees_follow_the_target_law() -> None:
    engine, shaper = tree_engine("model")
    observed: Counter[Outcome] = Counter()
    for run in range(N_RUNS // 2):  # the seeded rule is the greedy walk's, on keyed draws
        cfg = dataclasses.replace(FULL, seed=run)
        observed[outcome(emitted(engine, PROMPT, 4, cfg, 3, run_rng(run), Stats(), enough=2))] += 1
    assert any(any(n >= chain for n in path) for chain, _, path in shaper.seen)
    assert chi_square_pvalue(observed, exact_joint(target(), PROMPT, FULL)) > 1e-3


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_trees_reproduce_plain_decoding(drafter: str) -> None:
    prompt = PROMPTS[drafter]
    plain = emitted(Engine(target(), NgramDrafter()), prompt, 60, GREEDY, 0, run_rng(0), Stats())
    engine, shaper = tree_engine(drafter)
    stats = Stats()
    assert emitted(engine, prompt, 60, GREEDY, 4, run_rng(0), stats) == plain
    assert any(any(n >= chain for n in path) for chain, _, path in shaper.seen)
    assert list(engine.target.cached_tokens()) == [*prompt, *plain][: engine.target.n_past]


def test_the_chi_square_catches_a_tree_rule_that_keeps_every_sibling_it_tries() -> None:
    # A control: a rule that takes the second child without correcting p by the first's
    # rejection draws too often from the branches, and the test above must see it.
    model = target()
    cfg = FULL
    model.eval_block(PROMPT[:-1], "none")
    tokens, parents = [4, 5], [-1, -1]
    rows = model.eval_tree([PROMPT[-1], *tokens], [-1, 0, 0]).copy()
    counts: Counter[Outcome] = Counter()
    rng = np.random.default_rng(0)
    proposal = Proposal(tokens, None, Source.FREE, parents=tuple(parents))
    wrong: Counter[Outcome] = Counter()
    for _ in range(N_RUNS):
        path, bonus = accept_tree(proposal, rows, cfg, rng, len(PROMPT))
        counts[(tokens[path[0]] if path else bonus, -1)] += 1
        p = process(rows[0], cfg)
        first = 4 if rng.random() < p.prob(4) else (5 if rng.random() < p.prob(5) else p.sample(rng))
        wrong[(first, -1)] += 1
    law = {(int(t), -1): float(pr) for t, pr in enumerate(model.exact_probs(PROMPT, cfg)) if pr > 0}
    assert chi_square_pvalue(counts, law) > 1e-3
    assert chi_square_pvalue(wrong, law) < 1e-3
