"""Drafters propose tokens for the target to verify. One module each, found by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from localspec.sampling import Distribution, SamplingConfig


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    # One distribution per drafted token, or None for drafters that only guess (n-gram).
    dists: list[Distribution] | None = None
    # How much the context vouches for the guess: for n-gram lookup, how many tokens before
    # the draft match the text that preceded its earlier occurrence; 0 when unknown. The
    # draft-length policy keeps separate acceptance statistics per support level, because a
    # guess backed by a 20-token match is right far more often than one backed by 2 tokens.
    support: int = 0


class Drafter(Protocol):
    name: str

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        """A new request begins with this committed context (its last token not yet evaluated).
        warm=False: no draft is expected, so a draft model need not take the context in yet
        (its backlog says what it would have to catch up on if a draft comes after all)."""
        ...

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        """Up to n tokens that might follow context."""
        ...

    def backlog(self, context: Sequence[int]) -> int:
        """Tokens the drafter must take in before its first guess: a draft model that sat
        out some steps (γ = 0) has to catch up on what the target produced meanwhile."""
        ...

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        """The target kept n_accepted of the last draft; context now ends with its own token."""
        ...

    def close(self) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
