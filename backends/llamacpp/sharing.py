"""Which of the lanes' waiting blocks share the next pass (lanes.py): the oldest, and beside
it the blocks that make the pass worth most real rows per second on the cost curve."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class Block(Protocol):
    """A lane's block waiting for a pass (lanes._Ask)."""

    @property
    def tokens(self) -> list[int]: ...

    @property
    def alone(self) -> bool: ...


B = TypeVar("B", bound=Block)

# A busy lane that has not asked for its next block this long after another did is doing
# host work (a stop string, a slow client) or has ended without saying so: the pass runs
# without it rather than hold the others.
STRAGGLER_SECONDS = 0.02


def next_pass(pending: Sequence[B], row_limit: int, cost: Callable[[int], float], equal_only: bool) -> list[B]:
    """The blocks of the next pass, pending[0] first. A pass is as wide as its widest block
    (narrower ones are padded), so for each width it could have, it takes the blocks of that
    width and the narrower ones whose padding costs less than their share of a pass of their
    own; the rest wait. equal_only: no padding (a model with recurrent state, which padding
    rows would move), so only blocks as wide as the first share its pass."""
    first = pending[0]
    if first.alone or len(first.tokens) > row_limit:  # alone, as a lone request evaluates it
        return [first]
    shared = [a for a in pending if not a.alone]
    if equal_only:
        widths = [len(first.tokens)]
    else:
        widths = sorted({len(a.tokens) for a in shared if len(first.tokens) <= len(a.tokens) <= row_limit})
    best: tuple[float, list[B]] = (-1.0, [first])
    for width in widths:
        chosen = _at_width(first, width, shared, row_limit, cost, equal_only)
        real = sum(len(a.tokens) for a in chosen)
        value = real / max(cost(width * len(chosen)), 1e-9)
        if value > best[0]:
            best = (value, chosen)
    return best[1]


def _at_width(
    first: B, width: int, shared: list[B], row_limit: int, cost: Callable[[int], float], equal_only: bool
) -> list[B]:
    """A pass `width` rows a lane, holding `first`: the blocks of that width, then (unless
    equal_only) narrower ones where padding them costs less than their share of a pass of
    their own (of the blocks that may share a pass)."""
    room = row_limit // width
    same = [a for a in shared if a is not first and len(a.tokens) == width]
    chosen = [first, *same[: room - 1]]
    if equal_only:
        return chosen
    for block in shared:
        if len(chosen) >= room or block in chosen or len(block.tokens) > width:
            continue
        narrow = [a for a in shared if len(a.tokens) == len(block.tokens) and a not in chosen]
        own_share = cost(len(narrow) * len(block.tokens)) / len(narrow)
        if cost((len(chosen) + 1) * width) - cost(len(chosen) * width) <= own_share:
            chosen.append(block)
    return chosen
