"""Trees of guesses on real llama.cpp (backends/llamacpp/tree.py), on tiny random llamas whose
drafter is the target's weights slightly perturbed, so drafts agree often and branches are
both taken and passed over: each node's rows against a chain pass over its root path, the
cache after a tree pass against a clean pass's, greedy output against plain decoding, and
the sampled law of the first two tokens against the target's (chi-square).

llama.cpp's CPU kernels round a block of n rows a little differently from one of m rows
(LOGIT_TOLERANCE); greedy output may therefore part from plain decoding only at a near tie.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from scipy.stats import chisquare
from test_tree import EveryBranch

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.control.policy import FixedDraftLength
from localspec.core.drafting import Draft
from localspec.core.engine import Engine
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import SamplingConfig, process
from localspec.core.stats import Stats
from localspec.core.tree import root_path
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

pytestmark = pytest.mark.model

LOGIT_TOLERANCE = 2e-2
NEAR_TIE = 5e-2
GREEDY = SamplingConfig(temperature=0.0)
SAMPLED = SamplingConfig(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0)
RUNS = 1000  # about 2 ms a run with one thread
TARGET = Spec("llama")
DRAFT = Spec("llama", noise=0.2)
PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 72, 101, 108, 108, 111, 44, 32, 72, 101]
# After its last token the target's two likeliest tokens (about 0.48 each) both followed
# that token earlier: the lookup guesses one and branches with the other.
LOOKUP_PROMPT = [1, 173, 60, 42, 179, 48, 187, 179, 179, 103, 179]
PROMPTS = {"model": PROMPT, "ngram": LOOKUP_PROMPT}
# A random tree: node 0 continues the prompt, the rest hang where their parent says.
TOKENS = [PROMPT[-1], 108, 108, 111, 50, 51, 52, 53, 54]
PARENTS = [-1, 0, 1, 2, 0, 4, 1, 6, 4]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tree-models")
    return {"target": write_gguf(TARGET, folder / "target.gguf"), "draft": write_gguf(DRAFT, folder / "draft.gguf")}


@pytest.fixture(scope="module")
def opened(files: dict[str, Path]) -> Iterator[dict[str, LlamaCppBackend]]:
    backends = {
        # One thread: a tiny model's pass is shorter than two threads' handshake on a busy host.
        "target": LlamaCppBackend(str(files["target"]), n_ctx=256, threads=1),
        "clean": LlamaCppBackend(str(files["target"]), n_ctx=256, threads=1),
        "draft": LlamaCppBackend(str(files["draft"]), n_ctx=256, threads=1),
    }
    yield backends
    for backend in backends.values():
        backend.close()


def chain_rows(backend: LlamaCppBackend, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    backend.rollback(0)
    backend.eval_block(list(context), "none")
    return backend.eval_block(list(tokens), "all").copy()


def test_each_node_gets_the_rows_of_a_chain_over_its_root_path(opened: dict[str, LlamaCppBackend]) -> None:
    target, clean = opened["target"], opened["clean"]
    target.rollback(0)
    target.eval_block(PROMPT[:-1], "none")
    rows = target.eval_tree(TOKENS, PARENTS).copy()
    target.rollback(len(PROMPT) - 1)
    for node in range(len(TOKENS)):
        path = [TOKENS[i] for i in root_path(PARENTS, node)]
        np.testing.assert_allclose(rows[node], chain_rows(clean, PROMPT[:-1], path)[-1], atol=LOGIT_TOLERANCE)


def tree_with_a_branch_kept(target: LlamaCppBackend) -> list[int]:
    """The prompt, one tree pass over it and the branch [50, 51] kept, a branch other than
    sequence 0's (its tokens wait for the next pass: folds_branch); the text it keeps."""
    target.rollback(0)
    target.eval_block(PROMPT[:-1], "none")
    target.eval_tree(TOKENS, PARENTS)
    target.keep_branch([0, 4, 5])
    return [*PROMPT, 50, 51]


def test_the_cache_after_a_tree_pass_holds_the_kept_path_as_a_clean_pass_would(
    opened: dict[str, LlamaCppBackend],
) -> None:
    target, clean = opened["target"], opened["clean"]
    kept = tree_with_a_branch_kept(target)
    assert list(target.cached_tokens()) == kept
    # Sequence 0 holds the text up to the branch (the branch's tokens wait for the next pass,
    # which evaluates them first: folds_branch); no other sequence holds any cell.
    assert llama_cpp.llama_memory_seq_pos_min(target._mem, 0) == 0
    assert llama_cpp.llama_memory_seq_pos_max(target._mem, 0) == len(PROMPT) - 1
    assert all(llama_cpp.llama_memory_seq_pos_max(target._mem, s) == -1 for s in range(1, 6))
    # The same cells in the same order as a clean pass over the same blocks: the next rows are
    # its rows, bit for bit (flash attention sums cells in their order: tree.py and keep_branch).
    after = target.eval_block([60, 61], "all").copy()
    np.testing.assert_array_equal(after, chain_rows(clean, PROMPT, [50, 51, 60, 61])[-2:])
    assert llama_cpp.llama_memory_seq_pos_max(target._mem, 0) == len(kept) + 1
    kept += [60, 61]
    # A tree abandoned by a rollback leaves the cache as a chain's rollback does.
    target.eval_tree([62, 63, 64], [-1, 0, 0])
    target.rollback(len(kept))
    assert all(llama_cpp.llama_memory_seq_pos_max(target._mem, s) == -1 for s in range(1, 3))
    np.testing.assert_allclose(target.eval_block([60], "all"), chain_rows(clean, kept, [60]), atol=LOGIT_TOLERANCE)


def test_a_kept_branch_folded_into_the_next_tree_and_rolled_back_leaves_a_clean_cache(
    opened: dict[str, LlamaCppBackend],
) -> None:
    target, clean = opened["target"], opened["clean"]
    kept = tree_with_a_branch_kept(target)
    # The next tree takes them as its trunk: its nodes' rows are still their root paths'.
    rows = target.eval_tree([60, 61, 62], [-1, 0, 0]).copy()
    assert rows.shape[0] == 3
    for node, path in enumerate([[60], [60, 61], [60, 62]]):
        np.testing.assert_allclose(rows[node], chain_rows(clean, kept, path)[-1], atol=LOGIT_TOLERANCE)
    target.keep_branch([0, 2])
    assert list(target.cached_tokens()) == [*kept, 60, 62]
    assert llama_cpp.llama_memory_seq_pos_max(target._mem, 0) == len(kept)  # 62 waits
    target.rollback(len(kept) + 1)  # takes back a token the cache never held
    assert list(target.cached_tokens()) == [*kept, 60]
    np.testing.assert_allclose(
        target.eval_block([61], "all"), chain_rows(clean, [*kept, 60], [61]), atol=LOGIT_TOLERANCE
    )
    # A rollback below the deferred tokens drops them and the cells after it.
    target.eval_tree([60, 61, 62], [-1, 0, 0])
    target.keep_branch([0, 2])
    target.rollback(len(PROMPT))
    assert list(target.cached_tokens()) == PROMPT
    assert llama_cpp.llama_memory_seq_pos_max(target._mem, 0) == len(PROMPT) - 1
    np.testing.assert_allclose(target.eval_block([50], "all"), chain_rows(clean, PROMPT, [50]), atol=LOGIT_TOLERANCE)


def test_a_malformed_tree_is_refused_with_a_message(opened: dict[str, LlamaCppBackend]) -> None:
    target = opened["target"]
    target.rollback(0)
    with pytest.raises(InvalidRequestError, match="root"):
        target.eval_tree([5, 6], [0, -1])
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        target.eval_tree([5, 10**6], [-1, 0])
    assert target.n_past == 0


def test_a_hybrid_model_verifies_chains_only_and_says_so(tmp_path: Path) -> None:
    backend = LlamaCppBackend(str(write_qwen35_gguf(HybridSpec(), tmp_path / "hybrid.gguf")), n_ctx=256, threads=1)
    try:
        assert backend.capabilities.branches == 1
        with pytest.raises(InvalidRequestError, match="chains only"):
            backend.eval_tree([5, 6, 7], [-1, 0, 0])
        # The engine never asks: a drafter's branches stay unverified and the chain runs.
        lookup = NgramDrafter()
        lookup.branching = 1
        engine = Engine(backend, lookup, free_drafter=True)
        engine.trees = shaper = EveryBranch()
        assert len(generate(engine, GREEDY, 12, 3, prompt=LOOKUP_PROMPT)) == 12
        assert not shaper.seen
    finally:
        backend.close()


def tree_engine(opened: dict[str, LlamaCppBackend], drafter: str) -> tuple[Engine, EveryBranch]:
    if drafter == "model":
        draft = ModelDrafter(opened["draft"], min_confidence=0.0)
        draft.branching = 2
        engine = Engine(opened["target"], draft)
    else:
        lookup = NgramDrafter()
        lookup.branching = 1
        engine = Engine(opened["target"], lookup, free_drafter=True)
    shaper = EveryBranch()
    engine.trees = shaper
    return engine, shaper


def generate(
    engine: Engine, cfg: SamplingConfig, n: int, gamma: int, seed: int = 0, prompt: Sequence[int] = PROMPT
) -> list[int]:
    out: list[int] = []
    rng = np.random.default_rng(seed)
    for step in engine.generate(prompt, n, cfg, FixedDraftLength(gamma), Stats(), rng):
        out += step.tokens
    return out


def first_divergence_is_a_near_tie(a: list[int], b: list[int], clean: LlamaCppBackend) -> bool:
    i = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    row = chain_rows(clean, PROMPT[:-1], [PROMPT[-1], *a[:i]])[-1]
    return abs(float(row[a[i]]) - float(row[b[i]])) < NEAR_TIE


class AnswerKey:
    """A drafter that has read plain decoding's answer: its chain is the answer with one token
    wrong (at depth 0, 1, 2 in turn) and its branch there the answer's own tokens, so every
    step is a tree whose chain is rejected and whose branch is taken, at several depths. A
    tiny random llama answers greedily in loops no real drafter would branch on."""

    name = "answer-key"
    off_notice: str | None = None

    def __init__(self, prompt: Sequence[int], answer: Sequence[int], n_vocab: int) -> None:
        self.text, self.start_at, self.n_vocab, self.steps = [*prompt, *answer], len(prompt), n_vocab, 0

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        self.steps = 0

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        truth = self.text[len(context) : len(context) + n]
        if len(truth) < 2:
            return Draft(truth)
        depth = self.steps % min(3, len(truth))
        self.steps += 1
        wrong = [*truth[:depth], (truth[depth] + 1) % self.n_vocab, *truth[depth + 1 :]]
        return Draft(wrong, branches=[(depth, truth[depth:])])

    def backlog(self, context: Sequence[int]) -> int:
        return 0

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        pass

    def close(self) -> None:
        pass


def test_greedy_trees_whose_branches_are_taken_reproduce_plain_decoding(opened: dict[str, LlamaCppBackend]) -> None:
    plain = generate(Engine(opened["target"], NgramDrafter(), free_drafter=True), GREEDY, 40, 0)
    engine = Engine(opened["target"], AnswerKey(PROMPT, plain, opened["target"].info.n_vocab), free_drafter=True)
    engine.trees = shaper = EveryBranch()
    tree = generate(engine, GREEDY, 40, 4)
    assert tree == plain or first_divergence_is_a_near_tie(tree, plain, opened["clean"])
    # Every step took its branch, at depths 0, 1 and 2 in turn.
    assert len(shaper.seen) >= 8 and all(path[-1] >= chain for chain, _, path in shaper.seen)
    assert {heads[0][0] for _, heads, _ in shaper.seen} == {0, 1, 2}


def test_greedy_trees_of_a_draft_model_reproduce_plain_decoding(opened: dict[str, LlamaCppBackend]) -> None:
    plain = generate(Engine(opened["target"], NgramDrafter(), free_drafter=True), GREEDY, 40, 0)
    engine, shaper = tree_engine(opened, "model")
    tree = generate(engine, GREEDY, 40, 4)
    assert tree == plain or first_divergence_is_a_near_tie(tree, plain, opened["clean"])
    assert shaper.seen, "no step verified a tree"


END = -1  # the turn ended: the engine emits no end-of-generation token


def exact_first_two(clean: LlamaCppBackend, cfg: SamplingConfig, prompt: Sequence[int]) -> dict[tuple[int, int], float]:
    """P(t1, t2) for plain sampling, with END for a turn that ended before."""
    eog = clean.end_of_generation()
    first = process(chain_rows(clean, prompt[:-1], [prompt[-1]])[-1], cfg)
    law: Counter[tuple[int, int]] = Counter()
    for t1, p1 in zip(first.ids.tolist(), first.probs.tolist(), strict=True):
        if t1 in eog:
            law[(END, END)] += p1
            continue
        second = process(chain_rows(clean, prompt[:-1], [prompt[-1], t1])[-1], cfg)
        for t2, p2 in zip(second.ids.tolist(), second.probs.tolist(), strict=True):
            law[(t1, END if t2 in eog else t2)] += p1 * p2
    return dict(law)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_sampled_trees_follow_the_target_law(opened: dict[str, LlamaCppBackend], drafter: str) -> None:
    engine, shaper = tree_engine(opened, drafter)
    prompt = PROMPTS[drafter]
    counts: Counter[tuple[int, int]] = Counter()
    for seed in range(RUNS):
        a, b = [*generate(engine, SAMPLED, 3, 3, seed, prompt), END, END][:2]
        counts[(a, b)] += 1
    law = exact_first_two(opened["clean"], SAMPLED, prompt)
    assert set(counts) <= set(law)
    taken = sum(1 for chain, _, path in shaper.seen if any(n >= chain for n in path))
    assert taken > 20, "branches were seldom taken: the multi-candidate rule went untested"
    cells = [c for c in law if law[c] * RUNS >= 5]
    observed = [counts[c] for c in cells] + [RUNS - sum(counts[c] for c in cells)]
    expected = [law[c] * RUNS for c in cells] + [RUNS * (1 - sum(law[c] for c in cells))]
    assert chisquare(observed, np.array(expected) * RUNS / sum(expected)).pvalue > 1e-3
