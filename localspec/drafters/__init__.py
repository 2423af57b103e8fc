"""Drafters propose tokens for the target to verify, one module each (none, ngram, memory, model); the
protocol they implement (Drafter) lives with the engine's other protocols in core.protocol."""

from __future__ import annotations

from localspec.core.protocol import Draft, Drafter, common_prefix

__all__ = ["Draft", "Drafter", "common_prefix"]
