"""The draft-length policy a runtime gets: fixed where the caller fixed it, else the
adaptive policy on the target's cost curve, set up for its drafter (n-gram lookup, or a
draft model beside the lookup), with every setting read from one ControlConfig."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from localspec.control.calibrate import pair_agreement, starting_calibration, starting_drafting_seconds
from localspec.control.config import DEFAULT, ControlConfig
from localspec.control.costs import CostCurve
from localspec.control.policy import AdaptiveDraftLength, FixedDraftLength
from localspec.core.choices import DraftTokens
from localspec.core.protocol import Backend


def ngram_policy(curve: CostCurve, config: ControlConfig = DEFAULT) -> AdaptiveDraftLength:
    """The adaptive policy of a runtime that drafts by n-gram lookup alone."""
    return AdaptiveDraftLength(
        curve,
        config.ngram_seconds_per_token,
        max_gamma=config.max_draft,
        margin=config.ngram_margin,
        config=config,
    )


def model_policy(
    curve: CostCurve,
    draft_seconds: float,
    agreement: float,
    catch_up_seconds_per_token: float = 0.0,
    config: ControlConfig = DEFAULT,
) -> AdaptiveDraftLength:
    """The adaptive policy of a runtime with a draft model: the target's cost curve, the
    drafter's seconds per token and the pair's measured agreement as its prior, with n-gram
    lookup beside it."""
    return AdaptiveDraftLength(
        curve,
        draft_seconds,
        max_gamma=config.max_draft,
        prior=agreement,
        prior_weight=config.agreement_weight,
        catch_up_seconds_per_token=catch_up_seconds_per_token,
        margin=config.model_draft_margin,
        lookup_seconds_per_token=config.ngram_seconds_per_token,
        lookup_margin=config.ngram_margin,
        config=config,
    )


def block_policy(curve: CostCurve, pass_seconds: float, config: ControlConfig = DEFAULT) -> AdaptiveDraftLength:
    """The adaptive policy of a runtime with a block drafter (DFlash): one pass per draft,
    whatever part of its block is verified, with n-gram lookup beside it. Its acceptance
    starts from the bare prior and is learnt per position of the block."""
    return AdaptiveDraftLength(
        curve,
        0.0,
        max_gamma=config.max_draft,
        draft_seconds_per_pass=pass_seconds,
        margin=config.model_draft_margin,
        lookup_seconds_per_token=config.ngram_seconds_per_token,
        lookup_margin=config.ngram_margin,
        config=config,
    )


def fixed_policy(draft_tokens: DraftTokens, config: ControlConfig = DEFAULT) -> FixedDraftLength:
    """The length the caller fixed, or config.uncalibrated_draft for "auto" without a cost curve."""
    return FixedDraftLength(config.uncalibrated_draft if draft_tokens == "auto" else draft_tokens)


def priced_policy(
    target: Backend,
    draft: Backend | None,
    draft_tokens: DraftTokens,
    calibrate: bool = True,
    config: ControlConfig = DEFAULT,
    block_pass_seconds: float | None = None,
) -> AdaptiveDraftLength | None:
    """The policy for `target` drafted for by `draft` (None: n-gram lookup, or a block drafter
    whose pass takes block_pass_seconds), pricing draft lengths on a cost curve; None where the
    caller fixed the length or asked for no curve (calibrate=False): then fixed_policy. On a
    hybrid target every choice prices the replay a long rejection costs."""
    if draft_tokens != "auto" or not calibrate:
        return None
    # No pass is timed before the first token: the curve starts from what is known (see
    # starting_calibration) and learns from the passes decoding makes anyway.
    curve = starting_calibration(target).cost_curve(config)
    policy = _drafted_policy(curve, target, draft, block_pass_seconds, config)
    return replace(policy, replays_beyond=target.capabilities.replays_beyond)


def _drafted_policy(
    curve: CostCurve, target: Backend, draft: Backend | None, block_pass_seconds: float | None, config: ControlConfig
) -> AdaptiveDraftLength:
    if block_pass_seconds is not None:
        return block_policy(curve, block_pass_seconds, config)
    if draft is None:
        return ngram_policy(curve, config)
    # A model drafter starts from the pair's measured top-1 agreement (see calibrate.py).
    drafter = starting_calibration(draft)
    return model_policy(
        curve,
        starting_drafting_seconds(draft),
        pair_agreement(target, draft),
        drafter.verify_seconds[-1] / len(drafter.verify_seconds),
        config,
    )


def shared_policy(policy: AdaptiveDraftLength, target: Backend, busy: Callable[[], int]) -> AdaptiveDraftLength:
    """policy as one lane of a pool prices drafts: on the target's calibration as a
    SharedPassCurve, what k rows add to a pass beside the other busy lanes (busy(): the lanes
    in a request, this one too). A target with recurrent state (replays_beyond set) pads no
    lane, so its lanes share passes only among blocks of one width (backends/llamacpp/lanes.py)."""
    pads = target.capabilities.replays_beyond is None
    return replace(policy, costs=starting_calibration(target).cost_curve(policy.config, busy, pads))
