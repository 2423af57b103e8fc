"""Whether a greedy answer was plain decoding's bit for bit by construction.

Speculation verifies drafted tokens in a block; plain decoding evaluates one token per pass.
The two give the same logits only where the backend's kernels sum a block's rows in the
order of a one-token pass. A backend that knows its kernels says so in an Exactness
(`exactness` attribute); each request is then judged against how far its context went.
Sampled answers keep the target's distribution whatever the kernels: bit-exactness is a
greedy question.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.core.protocol import Backend, blocks_exact
from localspec.core.stats import Stats


@dataclass(frozen=True)
class Exactness:
    """How far a backend's verify blocks are known to give one-token passes' logits."""

    # Greedy speculation is plain decoding bit for bit while the context holds at most this
    # many tokens; None: at any length; 0: not known at all.
    cells: int | None
    why: str = ""  # what makes it inexact beyond `cells` (shown by run -v and bench)
    rows: int | None = None  # verify blocks longer than this are not covered (None: any)


UNKNOWN = Exactness(0, "this backend's kernels are not known to give a block the logits of one-token passes")


def judge(stats: Stats, exactness: Exactness | None, greedy: bool) -> None:
    """Record in stats whether this request's answer was plain decoding's by construction."""
    if not greedy:
        stats.bit_exact, stats.inexact_reason = None, ""
        return
    known = exactness or UNKNOWN
    reached = stats.prompt_tokens + stats.generated_tokens
    block = max(stats.gamma_histogram, default=0) + 1
    if known.rows is not None and block > known.rows and stats.drafted:
        stats.bit_exact, stats.inexact_reason = False, f"verify blocks of more than {known.rows} tokens"
    elif stats.drafted == 0 or known.cells is None or reached <= known.cells:
        stats.bit_exact, stats.inexact_reason = True, ""
    else:
        stats.bit_exact, stats.inexact_reason = False, known.why


def greedy_exact_within(backend: Backend) -> int | None:
    """The context length up to which any cut of a greedy answer into verify blocks gives plain
    decoding's text (None: any length; 0: none), from what the backend says of its kernels."""
    if blocks_exact(backend):
        return None
    known: Exactness = getattr(backend, "exactness", None) or UNKNOWN
    return known.cells
