"""A separate, smaller model with the same tokenizer drafts autoregressively.

The drafter's cache is kept in step with the committed text: tokens it drafted and the
target accepted stay cached, so an accepted draft token is never evaluated twice (llama.cpp's
loop re-decodes them). Only the target's own token after each step, plus the last draft token
when the whole draft was accepted, is new to the drafter.

The drafter stops early when it is unsure: once the token it just drafted had less than
`min_confidence` of its own probability, the tokens after it would rest on a guess the
target is unlikely to share, and each costs a drafter step. The rule looks only at the
drafter's side, so the verified output keeps the target's exact distribution. A request may
set the floor for its own drafts (Speculation.min_confidence; llama-server's
speculative.p_min maps onto it); 0 turns the stop off.

llama.cpp's p_min (common/speculative.cpp, draft and draft-eagle3) differs in two ways:
- llama.cpp drops the unsure token and stops; this drafter keeps it as the draft's last. Its
  row is already computed, so it costs one verify row and no drafter pass, and it is right
  about as often as its probability says; a row is cheap where a pass of a few tokens costs
  what one does (a GPU).
- llama.cpp reads the top token's probability among the draft sampler's top 10 candidates
  (renormalized, so never lower than the full softmax's), whatever the request's sampling;
  this drafter reads the full softmax greedily, and the request's own law when it samples.
At the same floor this drafter drafts a token more at each stop, and stops a little sooner;
run by llama.cpp's rule it drafts and accepts what llama.cpp does, at 0 and 0.3
(benchmarks/eagle3_agreement.py --llama-stop).

A prompt holding images (placeholder ids below 0, backends/llamacpp/vision.py) is read by a
separate draft model as its text alone: the image positions are left out of the drafter's
own context, so its positions run on contiguously over the text around them, and it drafts
from that. The target verifies every guess at its own positions, so what it outputs is
unchanged; only acceptance is what the missing image costs. A drafter that reads the
target's positions itself (an MTP or EAGLE-3 head: `reads_image_positions`) gets the context
as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from localspec.core.protocol import Backend, eval_chunked
from localspec.core.sampling import Distribution, SamplingConfig
from localspec.core.tree import alternatives
from localspec.drafters import Draft, common_prefix
from localspec.drafters.draw import draw

# Like transformers' assistant_confidence_threshold (0.4), a little lower: a stop costs the
# chance of a long accepted run, a wasted drafter step only its own time.
MIN_CONFIDENCE = 0.3


class ModelDrafter:
    name = "draft"

    def __init__(self, backend: Backend, min_confidence: float = MIN_CONFIDENCE) -> None:
        self.backend = backend
        self.min_confidence = min_confidence
        # Set when the context holds a token this drafter's vocabulary lacks (a target with a
        # larger vocabulary): drafting stops for the rest of the request, with this notice.
        self.off_notice: str | None = None
        # For a tree (localspec.core.tree): the first positions that also offer their second
        # most likely token, a branch tried where the drafted one is rejected.
        self.branching = 0
        self._agreed = 0  # the length of the drafter's view the cache agreed with at the last draft
        self._reads_images = bool(getattr(backend, "reads_image_positions", False))
        # A prompt holding images (start): its length and the drafter's view of it. Images sit
        # in the prompt only, so a later context's view is this one's and the text after it.
        self._imaged: tuple[int, list[int]] | None = None

    def _view_length(self, context: Sequence[int]) -> int:
        """The length of _view(context), without copying the context each step to count it."""
        if self._imaged is None:
            return len(context)
        length, seen = self._imaged
        return len(seen) + len(context) - length if len(context) >= length else sum(1 for t in context if t >= 0)

    def _view(self, context: Sequence[int]) -> Sequence[int]:
        """The context as this drafter reads it: a prompt's image positions left out unless it
        reads them (see the module doc); the context itself for a prompt without images."""
        if self._imaged is None:
            return context
        length, seen = self._imaged
        return [*seen, *context[length:]] if len(context) >= length else [t for t in context if t >= 0]

    def _readable(self, tokens: Sequence[int]) -> bool:
        # Image positions (below 0) are out of the view, or read by the drafter itself.
        if self.off_notice is None and (bad := next((t for t in tokens if t >= self.backend.info.n_vocab), None)):
            self.off_notice = (
                f"token {bad} is beyond the drafter {self.backend.info.name}'s vocabulary of "
                f"{self.backend.info.n_vocab}: drafting is off for the rest of this request"
            )
        return self.off_notice is None

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        self.off_notice = None
        images = not self._reads_images and len(context) > 0 and min(context) < 0
        self._imaged = (len(context), [t for t in context if t >= 0]) if images else None
        view = self._view(context)
        if not view or not self._readable(view):
            return
        keep = min(common_prefix(self.backend.cached_tokens(), view), len(view) - 1)
        self.backend.rollback(keep)
        self._agreed = keep
        if warm:
            eval_chunked(self.backend, view[keep:-1], "none")

    def propose(
        self,
        context: Sequence[int],
        n: int,
        cfg: SamplingConfig,
        rng: np.random.Generator,
        min_confidence: float | None = None,
    ) -> Draft:
        """Up to n tokens, ending after the first whose probability is under min_confidence
        (None: this drafter's own floor; localspec.core.protocol.StopsUnsure)."""
        floor = self.min_confidence if min_confidence is None else min_confidence
        past, view = self.backend.n_past, self._view(context)
        n = min(n, self.backend.info.n_ctx - len(view) - 1)
        if n <= 0 or not view or not self._readable(view[past:]):
            return Draft()
        row = eval_chunked(self.backend, view[past:], "last")[-1]
        self._agreed = len(view)
        tokens: list[int] = []
        dists: list[Distribution] = []
        branches: list[tuple[int, list[int]]] = []
        for i in range(n):
            drawn = draw(row, cfg, tokens, len(context) + i, rng)
            if drawn is None:
                break  # the grammar allows nothing more
            tok, dist, row = drawn
            tokens.append(tok)
            if dist is not None:
                dists.append(dist)
            if i < self.branching and (second := alternatives(row, tok, dist, 1)):
                branches.append((i, second))
            if i == n - 1 or _unsure(row, tok, dist, floor):
                break
            row = self.backend.eval_block([tok], "last")[-1]
        return Draft(tokens, None if cfg.greedy else dists, branches=branches or None)

    def backlog(self, context: Sequence[int]) -> int:
        # The context's last token is evaluated with the first guess in any case.
        if self.off_notice is not None:
            return 0
        return max(0, self._view_length(context) - 1 - self.backend.n_past)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        # context = committed text; what the drafter cached beyond its accepted part goes. A
        # tree's path may leave the drafted chain for a branch: only the chain's kept tokens
        # (n_accepted) agree with the text.
        keep = min(self.backend.n_past, self._view_length(context) - 1, self._agreed + n_accepted)
        self.backend.rollback(keep)
        self._agreed = keep

    def close(self) -> None:
        self.backend.close()


def _unsure(row: npt.NDArray[np.floating], tok: int, dist: Distribution | None, floor: float) -> bool:
    """Whether the drafted token's probability is under floor: the drafter's when it samples,
    its softmax's when greedy."""
    if floor <= 0:
        return False  # no floor: spare the pass over the vocabulary
    if dist is not None:
        return dist.prob(tok) < floor
    # Greedy: the top token's softmax probability is 1 / Σ exp(logit - top).
    return float(np.sum(np.exp(row - row[tok]))) > 1.0 / floor
