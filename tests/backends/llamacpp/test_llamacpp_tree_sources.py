"""Trees from what drafters that read the target's layers give, on real llama.cpp: a DFlash
block's per-position top-k and an EAGLE-3 head's top-2 (through ModelDrafter), verified in
one tree pass on a dense target that records its layer inputs for them (features.py).

The drafters are the tests' agreeing ones (dflash_support.py echoes a run of one token,
eagle3_support.py guesses a near-bigram target's next token), so chains are kept and cut,
and when sampling the runner-ups are taken often. After a tree pass keeps one branch, the
target's recorded rows must be the kept path's (what a chain pass over it leaves); output
must stay plain decoding's (greedy) and the target's law (chi-square at T > 0)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from repo_paths import DATA
from scipy.stats import chisquare
from test_llamacpp_tree import END, GREEDY, SAMPLED, exact_first_two, generate
from test_tree import EveryBranch

from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.control.costs import CostCurve
from localspec.control.factory import model_policy
from localspec.control.trees import AskedTree, TreeAsk, priced_trees
from localspec.core.engine import Engine
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import Spec, write_gguf

pytestmark = pytest.mark.model

DENSE = Spec("llama", embed_scale=0.05, seed=1)  # falls into runs of one token (test_llamacpp_dflash)
BIGRAM = Spec("llama", mix=0.02, head=1.0)  # close to a bigram model (test_llamacpp_eagle3)
LAYERS = (1, 2)
ROW_TOLERANCE = 2e-3  # a block of other rows rounds a layer's input this much apart
RUNS = 500
START = {"dflash": [1, 72, 101, 108, 108, 111, 44, 32, 72, 101], "eagle3": [119, 260, 35, 122, 114, 117, 111, 103]}
# Prompts run on into the greedy text this far: into a run of one token where the echoing
# DFlash drafter is right and its runner-ups are the target's too (it reads the tied head's
# neighbours), and where the EAGLE-3 head often agrees.
INTO = {"dflash": 44, "eagle3": 2}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tree-sources")
    dense, bigram = write_gguf(DENSE, folder / "dense.gguf"), write_gguf(BIGRAM, folder / "bigram.gguf")
    return {
        "dense": dense,
        "dflash": write_dflash_gguf(dense, folder / "dflash.gguf", DFlashSpec(target_layers=LAYERS)),
        "bigram": bigram,
        # g weighs as much as the token: the head is often wrong at once, and its runner-up right
        "eagle3": write_eagle3_gguf(BIGRAM, HeadSpec(fc=3.0), folder / "eagle3.gguf"),
    }


def tree_engine(kind: str, files: dict[str, Path], target: LlamaCppBackend) -> tuple[Engine, EveryBranch]:
    """The target verifying every branch its drafter offers at the first 3 positions."""
    if kind == "dflash":
        block = target.dflash_drafter(str(files["dflash"]))
        block.branching, block.alternatives = 3, 2
        engine = Engine(target, block)
    else:
        draft = ModelDrafter(target.eagle3_head(str(files["eagle3"])), min_confidence=0.0)
        draft.branching = 3
        engine = Engine(target, draft)
    engine.trees = shaper = EveryBranch()
    return engine, shaper


def prompt_of(kind: str, target: LlamaCppBackend) -> list[int]:
    start = START[kind]
    return start + generate(Engine(target, NgramDrafter(), free_drafter=True), GREEDY, INTO[kind], 0, prompt=start)


def taken(shaper: EveryBranch) -> int:
    """Tree steps whose kept path went through a branch."""
    return sum(1 for chain, _, path in shaper.seen if any(node >= chain for node in path))


def test_a_tree_pass_leaves_the_kept_paths_rows_as_a_chain_pass_would(files, opened) -> None:
    target, clean = opened(files["dense"]), opened(files["dense"])
    rows = target.layer_features(LAYERS, DENSE.hidden, "test", "test")
    clean_rows = clean.layer_features(LAYERS, DENSE.hidden, "test", "test")
    prompt = START["dflash"]
    cases = [
        # a branch off sequence 0 (evaluated again in order), then one whose kept path skips a node
        ([prompt[-1], 108, 108, 111, 50, 51, 52], [-1, 0, 1, 2, 0, 4, 1], [0, 4, 5]),
        ([prompt[-1], 108, 50, 109], [-1, 0, 0, 1], [0, 2]),
    ]
    for tokens, parents, path in cases:
        target.rollback(0)
        target.eval_block(prompt[:-1], "none")
        target.eval_tree(tokens, parents)
        target.keep_branch(path)
        kept = list(target.cached_tokens())
        assert kept == [*prompt[:-1], *(tokens[i] for i in path)]
        clean.rollback(0)
        clean.eval_block(kept, "none")
        n = len(kept)
        np.testing.assert_allclose(rows.rows[:n], clean_rows.rows[:n], atol=ROW_TOLERANCE)


@pytest.mark.parametrize(("kind", "target_file"), [("dflash", "dense"), ("eagle3", "bigram")])
def test_greedy_trees_of_drafters_reading_the_target_reproduce_plain_decoding(
    files, opened, kind: str, target_file: str
) -> None:
    target = opened(files[target_file])
    plain = generate(Engine(target, NgramDrafter(), free_drafter=True), GREEDY, 48, 0, prompt=START[kind])
    engine, shaper = tree_engine(kind, files, target)
    assert generate(engine, GREEDY, 48, 4, prompt=START[kind]) == plain
    assert len(shaper.seen) > 5, "few steps verified a tree"
    assert any(path and path[-1] < chain for chain, _, path in shaper.seen), "no chain token was kept"


@pytest.mark.parametrize(("kind", "target_file"), [("dflash", "dense"), ("eagle3", "bigram")])
def test_sampled_trees_of_drafters_reading_the_target_follow_its_law(
    files, opened, kind: str, target_file: str
) -> None:
    target, clean = opened(files[target_file]), opened(files[target_file])
    prompt = prompt_of(kind, target)
    engine, shaper = tree_engine(kind, files, target)
    counts: Counter[tuple[int, int]] = Counter()
    for seed in range(RUNS):
        a, b = [*generate(engine, SAMPLED, 3, 3, seed, prompt), END, END][:2]
        counts[(a, b)] += 1
    law = exact_first_two(clean, SAMPLED, prompt)
    assert set(counts) <= set(law)
    assert taken(shaper) > 20, "branches were seldom taken: the multi-candidate rule went untested"
    cells = [c for c in law if law[c] * RUNS >= 5]
    observed = [counts[c] for c in cells] + [RUNS - sum(counts[c] for c in cells)]
    expected = [law[c] * RUNS for c in cells] + [RUNS * (1 - sum(law[c] for c in cells))]
    assert chisquare(observed, np.array(expected) * RUNS / sum(expected)).pvalue > 1e-3


def h200_curve() -> CostCurve:
    curves = json.loads((DATA / "replay_curves.json").read_text())
    return CostCurve([t / 1e3 for t in curves["gpu-h200-llama-3.1-8b-bf16"]["verify_ms"]])


@pytest.mark.parametrize(("kind", "target_file"), [("dflash", "dense"), ("eagle3", "bigram")])
def test_a_drafter_reading_the_target_leaves_a_kept_branch_to_the_next_pass_so_trees_pay_on_a_gpu(
    files, opened, kind: str, target_file: str
) -> None:
    # The kept path's rows come from the tree pass (keep_branch), so what the tree left off
    # the first sequence is evaluated again with the next pass, not in a pass of its own: on
    # an H200's curve a few rows more cost little, and trees from these drafters pay there.
    target = opened(files[target_file])
    assert target.capabilities.repasses_branch and target.capabilities.folds_branch
    curve = h200_curve()
    assert priced_trees(target.capabilities, model_policy(curve, 0.05 * curve.verify(1, 0), 0.6)) is not None


def test_a_tree_asked_for_runs_where_the_controller_would_draft_chains(files, opened) -> None:
    target = opened(files["bigram"])
    plain = runtime_for(target, strategy="none").generate(prompt=START["eagle3"], max_tokens=40, temperature=0)
    head = target.eagle3_head(str(files["eagle3"]))
    runtime = runtime_for(target, head, strategy="draft", draft_tokens=3, calibrate=False, trees=TreeAsk(positions=2))
    asked = runtime.engine.trees
    assert isinstance(asked, AskedTree)
    assert runtime.generate(prompt=START["eagle3"], max_tokens=40, temperature=0).tokens == plain.tokens
    assert asked.steps > 5 and asked.taken > 0, (asked.steps, asked.taken)
