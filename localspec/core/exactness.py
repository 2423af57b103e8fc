"""Whether a greedy answer was plain decoding's bit for bit by construction.

Speculation verifies drafted tokens in a block; plain decoding evaluates one token per pass.
The two give the same logits only where the backend's kernels sum a block's rows in the
order of a one-token pass. A backend that knows its kernels says so in its capabilities'
Exactness (core.protocol); each request is then judged against how far its context went.
Sampled answers keep the target's distribution whatever the kernels: bit-exactness is a
greedy question.
"""

from __future__ import annotations

from localspec.core.protocol import Backend, Exactness, blocks_exact
from localspec.core.stats import Stats


def judge(stats: Stats, known: Exactness, greedy: bool) -> None:
    """Record in stats whether this request's answer was plain decoding's by construction."""
    if not greedy:
        stats.bit_exact, stats.inexact_reason = None, ""
        return
    if stats.reused_tokens:
        _judge_reuse(stats, known)
    reached = stats.prompt_tokens + stats.generated_tokens
    block = max(stats.gamma_histogram, default=0) + 1
    if known.rows is not None and block > known.rows and stats.drafted:
        stats.bit_exact, stats.inexact_reason = False, f"verify blocks of more than {known.rows} tokens"
    elif stats.drafted == 0 or known.cells is None or reached <= known.cells:
        stats.bit_exact, stats.inexact_reason = True, ""
    else:
        stats.bit_exact, stats.inexact_reason = False, known.why


def _judge_reuse(stats: Stats, known: Exactness) -> None:
    """A cached prefix that earlier passes computed in other blocks than a fresh evaluation
    would gives its answer only where the backend's kernels sum both block sizes alike."""
    # The engine counts as reused only rows that neither the fresh evaluation's own blocks, nor
    # blocks summing as one-token passes, nor large blocks computed (localspec.core.reuse): those may part.
    if known.prompt_rows is None or stats.reused_tokens == 0:
        stats.fresh_exact, stats.fresh_inexact_reason = True, ""
        return
    stats.fresh_exact = False
    stats.fresh_inexact_reason = (
        f"reused {stats.reused_tokens} cached tokens that earlier passes evaluated in other blocks than a fresh "
        f"evaluation's {stats.reused_fresh_rows} rows ({known.prompt_why})"
    )


def greedy_exact_within(backend: Backend) -> int | None:
    """The context length up to which any cut of a greedy answer into verify blocks gives plain
    decoding's text (None: any length; 0: none), from what the backend says of its kernels."""
    if blocks_exact(backend):
        return None
    return backend.capabilities.exactness.cells
