"""A separate, smaller model with the same tokenizer drafts autoregressively.

The drafter's cache is kept in step with the committed text: tokens it drafted and the
target accepted stay cached, so an accepted draft token is never evaluated twice (llama.cpp's
loop re-decodes them). Only the target's own token after each step, plus the last draft token
when the whole draft was accepted, is new to the drafter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.drafters import Draft, common_prefix
from localspec.protocol import Backend, eval_chunked
from localspec.sampling import Distribution, SamplingConfig, process


class ModelDrafter:
    name = "draft"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def start(self, context: Sequence[int]) -> None:
        keep = min(common_prefix(self.backend.cached_tokens(), context), len(context) - 1)
        self.backend.rollback(keep)
        eval_chunked(self.backend, context[keep:-1], "none")

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        past = self.backend.n_past
        n = min(n, self.backend.info.n_ctx - len(context) - 1)
        if n <= 0:
            return Draft()
        row = eval_chunked(self.backend, context[past:], "last")[-1]
        tokens: list[int] = []
        dists: list[Distribution] = []
        for i in range(n):
            if cfg.greedy:
                tok = int(np.argmax(row))
            else:
                dist = process(row, cfg)
                tok = dist.sample(rng)
                dists.append(dist)
            tokens.append(tok)
            if i < n - 1:
                row = self.backend.eval_block([tok], "last")[-1]
        return Draft(tokens, None if cfg.greedy else dists)

    def backlog(self, context: Sequence[int]) -> int:
        # The context's last token is evaluated with the first guess in any case.
        return max(0, len(context) - 1 - self.backend.n_past)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        # context = committed text; what the drafter cached beyond its accepted part goes.
        self.backend.rollback(min(self.backend.n_past, len(context) - 1))

    def close(self) -> None:
        self.backend.close()
