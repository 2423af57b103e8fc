"""No drafting: plain autoregressive decoding through the same loop, the baseline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from localspec.core.sampling import SamplingConfig
from localspec.drafters import Draft


class NoDrafter:
    name = "none"
    off_notice: str | None = None
    never_guesses: Literal[True] = True  # core.drafting.NeverGuesses

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        pass

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        return Draft()

    def backlog(self, context: Sequence[int]) -> int:
        return 0

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        pass

    def close(self) -> None:
        pass
