"""The one place a runtime's parts are put together: a Plan's drafters, the draft-length policy
priced for them (calibrate(), the step that may measure this machine), the tree shaper that
policy's cost curve allows, and the engine holding them. What it returns is not changed
afterwards: what one request chooses (reuse a cached prefix, draft or not) travels with that
request (localspec.core.engine.PerRequest), never as a field set on a part.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

from localspec.common.progress import Announce, announced
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.trees import BRANCHING, OffersAlternatives, asked_tree, priced_trees
from localspec.core.choices import TreeAsk, Trees
from localspec.core.drafting import Branching, DraftLengthPolicy, TreeShaper
from localspec.core.engine import Engine
from localspec.strategies import Plan


@dataclass(frozen=True)
class Calibrated:
    """A plan's draft-length policy, and the same when it prices lengths on a cost curve (None:
    a fixed length, or a policy the caller gave)."""

    policy: DraftLengthPolicy
    priced: AdaptiveDraftLength | None = None


@dataclass(frozen=True)
class Assembly:
    """A runtime's parts, built once by assemble()."""

    engine: Engine
    policy: DraftLengthPolicy
    priced: AdaptiveDraftLength | None  # the policy, where it prices draft lengths on a cost curve
    trees: TreeShaper | None  # which branches a step verifies beside its chain; None: chains only


def calibrate(plan: Plan, on_progress: Announce | None = None) -> Calibrated:
    """The plan's draft-length policy. Pricing a draft model measures how often it agrees with
    the target (once per pair and machine, then cached), announced through on_progress."""
    saying = "comparing the drafter with the target"
    with announced(saying, on_progress) if plan.draft is not None else nullcontext():
        policy, priced = plan.policy()
    return Calibrated(policy, priced)


def assemble(
    plan: Plan,
    calibrated: Calibrated | DraftLengthPolicy | None = None,
    trees: Trees | None = None,
) -> Assembly:
    """The engine over the plan's drafters with its policy and tree shaper. calibrated: the
    policy calibrate() built, or one the caller chose (a replay's, an experiment's); None:
    calibrate() now. trees: a TreeAsk, that tree whatever the curve says; "off", chains only;
    "auto" or None, trees where the policy's cost curve says they pay."""
    if calibrated is None:
        calibrated = calibrate(plan)
    elif not isinstance(calibrated, Calibrated):
        calibrated = Calibrated(calibrated)
    shaper: TreeShaper | None = None
    positions, alternatives = 0, 0
    if isinstance(trees, TreeAsk):
        shaper, positions, alternatives = asked_tree(plan.target, trees), trees.positions, trees.alternatives
    elif trees != "off" and calibrated.priced is not None:
        shaper = priced_trees(plan.target.capabilities, calibrated.priced)
        positions = BRANCHING if shaper is not None else 0
    for drafter in (plan.drafter, plan.lookup):
        # The drafters that can offer branches (model, ngram, dflash) offer them only where a
        # tree is verified: elsewhere it is work for nothing.
        if positions and isinstance(drafter, Branching):
            drafter.branching = positions
        if alternatives and isinstance(drafter, OffersAlternatives):
            drafter.alternatives = alternatives
    engine = Engine(plan.target, plan.drafter, free_drafter=plan.free, lookup=plan.lookup, trees=shaper)
    return Assembly(engine, calibrated.policy, calibrated.priced, shaper)
