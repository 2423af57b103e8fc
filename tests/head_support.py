"""What the tests of drafters that run inside their target (MTP heads, Gemma 4 assistants)
check the same way on every backend: the pair's agreement against a reference walked as the
engine drafts, and the policy a runtime gets at the default draft length."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.control import calibrate
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.protocol import Backend


def walked_agreement(target: Backend, head: Backend, tokens: Sequence[int]) -> float:
    """The share of positions q where the head's top-1 after tokens[:q+1] is the target's,
    each read as the engine drafts: the target holds tokens[:q] and the head reads x_q at
    the target's next position. Two fresh passes per position: a reference, not a measure."""
    same = []
    for q in range(len(tokens)):
        target.rollback(0)
        head.rollback(0)
        if q:
            target.eval_block(tokens[:q], "none")
            head.eval_block(tokens[:q], "none")
        guess = int(np.argmax(head.eval_block(tokens[q : q + 1], "last")[-1]))
        same.append(guess == int(np.argmax(target.eval_block(tokens[q : q + 1], "last")[-1])))
    target.rollback(0)
    head.rollback(0)
    return float(np.mean(same))


def assert_agreement_is_measured_as_it_drafts(target: Backend, head: Backend, tokens: Sequence[int]) -> None:
    """calibrate.agreement() on a head gives the walked reference and leaves both empty."""
    measured = calibrate.agreement(target, head, tokens)
    assert target.n_past == 0 and head.n_past == 0
    assert measured == walked_agreement(target, head, tokens)


def assert_calibrated_as_users_run_it(target: Backend, head: Backend, policy: object) -> None:
    """A runtime at the default draft length with calibration on: the adaptive policy starts
    from the pair's agreement, and prices a drafted token by the head's size."""
    assert isinstance(policy, AdaptiveDraftLength)
    assert policy.prior == calibrate.pair_agreement(target, head)  # measured when it was built, cached since
    # Priced by its own size (calibrate.prior_calibration), not as a pass of the whole target.
    assert head.info.size_bytes < target.info.size_bytes and head.info.n_params < target.info.n_params
    assert policy.draft_seconds_per_token == calibrate.starting_drafting_seconds(head)


# On a GPU device whose load check found blocks parting from one-token passes
# (device_check.py), rows the same text gave in blocks of other sizes differ by its kernels'
# rounding (up to 1e-2 on lavapipe, logits of 5-20); another token's row differs by whole units.
DEVICE_ATOL = 0.05


def blocks_atol(backend: Backend, atol: float, block: int) -> float:
    """atol where blocks of up to `block` tokens give one-token passes' logits, else DEVICE_ATOL."""
    rows = backend.capabilities.exactness.rows
    if backend.capabilities.device == "gpu" and rows is not None and rows < block:
        return max(atol, DEVICE_ATOL)
    return atol


def assert_each_row_is_the_token_asked_for(
    target: Backend, head: Backend, text: Sequence[int], frontier: int, atol: float
) -> None:
    """A head reading several tokens in one pass and asked for the last row only, as it reads
    again what a verify pass kept together with the token after it, gives that token's row
    (not the batch's first), and drafts on from that token's state.

    The reference asks for every row of the same text: what it gives does not depend on which
    rows llama.cpp hands back first. The target holds text[:frontier]: the last token read is
    one it has not decoded, so the token drafted after it is read with the head's own state."""
    atol = blocks_atol(target, atol, frontier + 1)
    target.eval_block(text[:frontier], "none")
    clean = head.eval_block(text[: frontier + 1], "all").copy()
    drafted = head.eval_block(text[frontier + 1 : frontier + 2], "last").copy()
    target.rollback(0)
    head.rollback(0)
    target.eval_block(text[:frontier], "none")
    head.eval_block(text[: frontier - 2], "none")
    last = head.eval_block(text[frontier - 2 : frontier + 1], "last")[-1].copy()
    np.testing.assert_allclose(last, clean[-1], atol=atol, err_msg="the last row read is another token's")
    again = head.eval_block(text[frontier + 1 : frontier + 2], "last")
    np.testing.assert_allclose(again, drafted, atol=atol, err_msg="the state drafted from is another token's")
    target.rollback(0)
    head.rollback(0)
