"""The controller prices a tree by its node count on the machine's cost curve
(localspec/control/trees.py): replayed on the recorded answers (localspec/control/tree_replay.py)
on a simulated clock, this 2-core CPU's curve chooses chains, while an H200's, where a pass of
twenty rows costs about what one of two does, chooses trees where they pay and gains by them."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import pytest
from repo_paths import DATA

from localspec import strategies
from localspec.assembly import Calibrated, assemble
from localspec.backends.reference import ReferenceBackend
from localspec.control.costs import CostCurve
from localspec.control.factory import ngram_policy
from localspec.control.replay import Truth, calibration_from_doctor
from localspec.control.tree_replay import HeadModel, TreeRun, replay_head_tree, replay_tree
from localspec.control.trees import AskedTree, TreeAsk, TreePricing, asked_tree
from localspec.core.errors import InvalidRequestError
from localspec.drafters.ngram import NgramDrafter

ANSWERS: dict[str, Any] = json.loads((DATA / "replay_answers.json").read_text())
CURVES: dict[str, dict[str, Any]] = json.loads((DATA / "replay_curves.json").read_text())
CPU, GPU = "smollm2-135m-q4_1", "gpu-h200-llama-3.1-8b-bf16"
# The trees' speedup on the H200 curve over all answers (benchmarks/tree_replay.py prints it).
GOLDEN_GPU_TREES = 1.655
GOLDEN_GPU_FOLDED = 1.653  # the same where a kept branch is evaluated again with the next pass
# A simulated head's top-2 trees (HeadModel's defaults) on the H200 curve, and its chains.
GOLDEN_HEAD_TREES, GOLDEN_HEAD_CHAINS = 2.123, 1.868


@functools.cache
def replayed(name: str, mode: str, repass: bool = False, fold: bool = False) -> tuple[float, int, int]:
    """(speedup over plain decoding, tree steps, steps that took a branch), all answers."""
    cal = calibration_from_doctor(CURVES[name])
    truth = Truth.of(cal)
    plain = seconds = 0.0
    trees = taken = 0
    for rec in ANSWERS["answers"].values():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        run: TreeRun = replay_tree(prompt, answer, cal, ANSWERS["n_vocab"], mode, repass, fold)
        plain, seconds = plain + truth.plain(prompt, answer), seconds + run.seconds
        trees, taken = trees + run.trees, taken + run.taken
    return plain / seconds, trees, taken


def test_on_this_cpus_curve_the_controller_chooses_chains() -> None:
    priced, trees, _ = replayed(CPU, "priced")
    assert trees == 0
    assert priced == pytest.approx(1.083, abs=0.0015)  # the chain replay's figure (test_controller_replays)


def test_on_a_gpus_curve_the_controller_chooses_trees_where_they_pay() -> None:
    chain, _, _ = replayed(GPU, "chain")
    priced, trees, taken = replayed(GPU, "priced")
    assert trees >= 100 and taken >= 20
    assert priced > chain
    assert priced == pytest.approx(GOLDEN_GPU_TREES, abs=0.0015)


def test_where_a_kept_branch_costs_a_pass_more_the_controller_prices_that_too() -> None:
    # llama.cpp evaluates a kept branch again (its cells must come in order): a branch-taken
    # step costs a pass more, and the lookup's second continuation then seldom pays even on
    # the H200's curve; the controller keeps to chains there rather than lose to them.
    chain, _, _ = replayed(GPU, "chain", True)
    priced, trees, _ = replayed(GPU, "priced", True)
    assert trees < replayed(GPU, "priced")[1] / 4
    assert priced >= chain - 0.001
    assert replayed(GPU, "always", True)[0] < chain  # bought at any price, they lose


def test_where_a_kept_branch_rides_on_the_next_pass_trees_pay_almost_as_if_kept_in_place() -> None:
    # llama.cpp folds that second evaluation into the next verify pass (Capabilities.folds_branch):
    # on the H200's curve a few rows more cost little, and the controller takes the trees again.
    priced, trees, taken = replayed(GPU, "priced", True, True)
    assert trees >= 100 and taken >= 20
    assert priced == pytest.approx(GOLDEN_GPU_FOLDED, abs=0.0015)
    assert replayed(GPU, "chain")[0] < priced <= replayed(GPU, "priced")[0]


@functools.cache
def head_replayed(name: str, mode: str, fold: bool) -> tuple[float, int, int]:
    """replayed() with a simulated head's top-2 (tree_replay.GuessingHead) instead of n-gram lookup."""
    cal = calibration_from_doctor(CURVES[name])
    truth = Truth.of(cal)
    plain = seconds = 0.0
    trees = taken = 0
    for rec in ANSWERS["answers"].values():
        prompt, answer = list(rec["prompt"]), list(rec["answer"])
        run = replay_head_tree(prompt, answer, cal, ANSWERS["n_vocab"], HeadModel(), mode, True, fold)
        plain, seconds = plain + truth.plain(prompt, answer), seconds + run.seconds
        trees, taken = trees + run.trees, taken + run.taken
    return plain / seconds, trees, taken


def test_trees_from_a_head_reading_the_target_pay_on_a_gpus_curve_once_a_kept_branch_rides_the_next_pass() -> None:
    # An EAGLE-3 head's runner-ups: charged a pass of their own for a kept branch (as llama.cpp
    # did where a drafter read its layers) they never pay; folded into the next pass they do.
    chain, _, _ = head_replayed(GPU, "chain", True)
    alone, alone_trees, _ = head_replayed(GPU, "priced", False)
    folded, trees, taken = head_replayed(GPU, "priced", True)
    assert alone_trees == 0 and alone == pytest.approx(chain)
    assert trees >= 100 and taken >= 20
    assert folded > chain * 1.1
    assert (folded, chain) == pytest.approx((GOLDEN_HEAD_TREES, GOLDEN_HEAD_CHAINS), abs=0.0015)
    assert head_replayed(CPU, "priced", True)[1] == 0  # this CPU's curve: chains


def pricing(curve_ms: list[float], alpha: float) -> TreePricing:
    policy = ngram_policy(CostCurve([t / 1e3 for t in curve_ms]))
    policy.alpha = [alpha] * len(policy.alpha)
    return TreePricing(policy)


def test_a_branch_is_priced_by_the_nodes_it_adds() -> None:
    offered = [(0, [7, 8, 9]), (2, [5])]
    flat = pricing(CURVES[GPU]["verify_ms"], 0.5)
    steep = pricing(CURVES[CPU]["verify_ms"], 0.5)
    chosen = flat.shape(4, 0, offered, 0)
    # The branch at depth 2 is tried only a quarter of the time, and adds under the 2 % margin.
    assert [d for d, _ in chosen] == [0]
    assert len(chosen[0][1]) == 3  # α = 0.5 carries the branch on
    assert steep.shape(4, 0, offered, 0) == []
    # A chain the target nearly always takes leaves nothing for a branch to win.
    assert pricing(CURVES[GPU]["verify_ms"], 0.99).shape(4, 0, offered, 0) == []


def test_branches_that_come_true_raise_their_estimate() -> None:
    trees = pricing(CURVES[GPU]["verify_ms"], 0.5)
    before = trees.beta(0)
    for _ in range(20):
        trees.observe_tree(4, [(0, 4)], [4, 5])  # the chain's first token rejected, the branch kept
    assert trees.beta(0) > before
    for _ in range(20):
        trees.observe_tree(4, [(1, 4)], [0, 1, 2])  # reached past depth 1: the branch was not tried
    assert trees.beta(1) == pytest.approx(trees.prior)


@pytest.mark.parametrize(("curve", "trees"), [(GPU, True), (CPU, False)])
def test_a_runtime_verifies_trees_only_where_its_curve_lets_them_pay(curve: str, trees: bool) -> None:
    policy = ngram_policy(CostCurve([t / 1e3 for t in CURVES[curve]["verify_ms"]]))
    plan = strategies.plan(ReferenceBackend(), None, "ngram")
    assembled = assemble(plan, Calibrated(policy, policy))
    assert isinstance(assembled.trees, TreePricing) is trees
    assert assembled.engine.trees is assembled.trees
    assert isinstance(plan.drafter, NgramDrafter) and bool(plan.drafter.branching) is trees  # not on a CPU
    # A target that verifies chains only never gets trees, whatever the curve.
    chains = ReferenceBackend()
    chains.capabilities = dataclasses.replace(chains.capabilities, branches=1)
    assert assemble(strategies.plan(chains, None, "ngram"), Calibrated(policy, policy)).engine.trees is None


def test_trees_turned_off_leave_chains_even_where_the_curve_would_take_trees() -> None:
    policy = ngram_policy(CostCurve([t / 1e3 for t in CURVES[GPU]["verify_ms"]]))
    plan = strategies.plan(ReferenceBackend(), None, "ngram")
    assert assemble(plan, Calibrated(policy, policy), "off").engine.trees is None
    assert isinstance(plan.drafter, NgramDrafter) and not plan.drafter.branching  # no runner-ups looked up


def test_a_tree_asked_for_verifies_every_branch_offered_at_its_first_positions() -> None:
    asked = AskedTree(positions=2, max_nodes=8)
    offered = [(0, [7, 8]), (1, [5]), (2, [6]), (1, [9, 10, 11])]
    # Depth 2 is past the positions asked for; the last branch would pass the 8 nodes.
    assert asked.shape(4, 0, offered, 0) == [(0, [7, 8]), (1, [5])]
    assert asked.shape(1, 0, offered, 0) == [(0, [7, 8])]  # no branch beside a chain it outgrows


def test_a_tree_asked_for_is_verified_even_where_the_curve_would_choose_chains() -> None:
    cpu = ngram_policy(CostCurve([t / 1e3 for t in CURVES[CPU]["verify_ms"]]))
    plan = strategies.plan(ReferenceBackend(), None, "ngram")
    assembled = assemble(plan, Calibrated(cpu, cpu), TreeAsk(positions=3))
    assert isinstance(assembled.engine.trees, AskedTree) and assembled.engine.trees.positions == 3
    assert isinstance(plan.drafter, NgramDrafter) and plan.drafter.branching == 3
    chains = ReferenceBackend()
    chains.capabilities = dataclasses.replace(chains.capabilities, branches=1)
    with pytest.raises(InvalidRequestError, match="verifies chains only"):
        asked_tree(chains, TreeAsk())
