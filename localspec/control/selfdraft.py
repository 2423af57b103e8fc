"""Self-drafting without a second download: the drafter is derived from the target by the
target's own backend (localspec.core.protocol.SelfDrafting).

- qspec[:TYPE]: the target requantized to a low-bit type (QSpec-style).
- layerskip[:L]: the target with some transformer blocks left out (early exit after block L,
  or on llama.cpp a set of middle blocks skipped, as in training-free layer skipping),
  reusing the target's final norm and output head.

Without an explicit TYPE or L, candidates are derived and the one with the best predicted
tokens/s on this machine wins: top-1 agreement with the target on a calibration text
(acceptance) against the drafter's measured step cost, through the same formula the
adaptive controller uses. The choice is remembered per target and machine.
"""

from __future__ import annotations

from collections.abc import Callable

from localspec.common.progress import report, stage
from localspec.control.calibrate import (
    CALIBRATION_TEXT,
    agreement,
    backend_key,
    calibrated,
    drafting_seconds,
)
from localspec.control.policy import AdaptiveDraftLength
from localspec.control.prompts import CODE, PASSAGE
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend
from localspec.store import CALIBRATION

KINDS = ("qspec", "layerskip", "mtp")


def parse(strategy: str) -> tuple[str, str | None] | None:
    """("qspec", "Q2_K") for "qspec:Q2_K"; None for strategies that are not self-drafting."""
    kind, _, option = strategy.partition(":")
    if kind not in KINDS:
        return None
    return kind, option or None


def layerskip_blocks(option: str | None, n_layers: int) -> int | None:
    """How many blocks layerskip:L keeps, checked against the model's n_layers; None when no
    L was given (the measured best)."""
    if option is None:
        return None
    try:
        keep = int(option)
    except ValueError:
        raise InvalidRequestError(f"layerskip takes the number of blocks to keep, got {option!r}") from None
    if not 1 <= keep < n_layers:
        raise InvalidRequestError(f"layerskip:{keep} must keep between 1 and {n_layers - 1} of {n_layers} blocks")
    return keep


def exit_candidates(n_layers: int) -> list[str]:
    """Early exits worth measuring for an in-memory layer-skip drafter: from half the blocks
    (cheap, agrees less) to five sixths (agrees more, costs more)."""
    keep = {min(n_layers - 1, max(1, round(n_layers * f))) for f in (1 / 2, 2 / 3, 3 / 4, 5 / 6)}
    return [str(k) for k in sorted(keep)]


def early_exit_drafter(target: Backend, option: str | None, n_layers: int, cut: Callable[[int], Backend]) -> Backend:
    """layerskip[:L] on a backend that stops its own pass early: cut(L), or without L the exit
    among exit_candidates with the best predicted tokens/s."""
    keep = layerskip_blocks(option, n_layers)
    if keep is not None:
        return cut(keep)
    return best_drafter(target, "layerskip", exit_candidates(n_layers), lambda label: cut(int(label)))


def best_drafter(target: Backend, kind: str, labels: list[str], make: Callable[[str], Backend]) -> Backend:
    """The self-drafter (made by make(label)) with the best predicted tokens/s on this
    machine; the choice is remembered per target and machine, so later loads make only the
    winner."""
    key = f"self-draft|{kind}|{backend_key(target)}"
    hit = CALIBRATION.get(key)
    if len(labels) == 1 or (hit is not None and hit.get("label") in labels):
        return make(labels[0] if len(labels) == 1 else str(hit["label"]))  # type: ignore[index]
    text = target.tokenize(CALIBRATION_TEXT + "\n" + CODE + "\n" + PASSAGE, add_special=True, parse_special=False)
    text = text[: target.info.n_ctx]
    scored = []
    for i, label in enumerate(labels, 1):
        with stage(f"candidate {i} of {len(labels)} ({label})"):
            draft = make(label)
            try:
                report("comparing it with the target")
                alpha = agreement(target, draft, text)
                report("timing it")
                scored.append((predicted_rate(target, draft, alpha), label))
            finally:
                draft.close()
    _, best = max(scored)
    CALIBRATION.put(key, {"label": best})
    return make(best)


def predicted_rate(target: Backend, draft: Backend, alpha: float) -> float:
    policy = AdaptiveDraftLength(calibrated(target).cost_curve(), drafting_seconds(draft), prior=alpha)
    return policy.rate(policy.choose(policy.max_gamma))
