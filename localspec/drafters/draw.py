"""How a drafter chooses its token from its logits, so that the rejection rule's q is the law
the token was drawn from (core.acceptance): one rule for every drafter that reads logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from localspec.core.sampling import Distribution, SamplingConfig, process, shape


class Drawn(NamedTuple):
    """A drafted token, the law it was drawn from (None when greedy), and the logits it was read
    from, shaped as the target's are (what a branch's runner-up and a confidence stop read)."""

    token: int
    dist: Distribution | None
    row: npt.NDArray[np.floating]


def draw(
    row: npt.NDArray[np.floating],
    cfg: SamplingConfig,
    drafted: Sequence[int],
    position: int,
    rng: np.random.Generator,
) -> Drawn | None:
    """The token a drafter guesses at `position` of the text after `drafted` (this draft's tokens
    so far): the argmax when greedy, else a draw from the row's law shaped as the target's is (the
    grammar, logit_bias, penalties over this draft), with the target's own keyed noise when the
    request is seeded, so agreeing laws agree on the token (accept_seeded). None where the
    grammar allows nothing more."""
    if cfg.shapes_logits:
        row = shape(row[None], cfg, (), drafted, start=len(drafted))[0]
        if not np.isfinite(row.max()):
            return None
    dist = None if cfg.greedy else process(row, cfg)
    if dist is None:
        token = int(np.argmax(row))
    elif cfg.seed is not None:
        token = dist.keyed_sample(cfg.seed, position)
    else:
        token = dist.sample(rng)
    return Drawn(token, dist, row)
