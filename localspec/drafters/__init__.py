"""Drafters propose tokens for the target to verify, one module each (none, ngram, memory, model); the
protocol they implement (Drafter) lives with the engine's other protocols in core.protocol."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from localspec.core.protocol import Draft, Drafter, common_prefix

__all__ = ["BlockDrafter", "Draft", "Drafter", "common_prefix"]


@runtime_checkable
class BlockDrafter(Drafter, Protocol):
    """A drafter that proposes a whole block in one pass (DFlash): the controller prices the
    pass once per draft, whatever part of the block it verifies."""

    block: int  # the most tokens one pass proposes, the anchor included
    pass_seconds: float  # one pass on this machine, measured when it was loaded
