"""Which cached prompt rows a new request may keep and still get a fresh evaluation's bits
(reuse_prefix="exact", serve's default), from how each cached row went in.

A fresh evaluation puts prompt[:-1] in blocks of max_block rows from position 0 (eval_chunked;
on a CPU in cancellable pieces of 64+ rows). Three kinds of cached rows give its bits:
- rows of whole max_block blocks of the same text (the canonical prefix);
- for a prompt short enough to go in as one block that sums as one-token passes (the kernels'
  prompt_rows), every row that one-token passes or such blocks computed;
- for a prompt of one block of at least the kernels' `pieces_from` rows, every row that such
  blocks computed from position 0, when the rest also goes in as one such block: those
  kernels give a row the same bits whatever the block's size and where it starts
  (localspec.testing.block_probe checks it on each host kind). A chat's system turn and an
  earlier turn are kept so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.core.protocol import Exactness


@dataclass
class CachedRows:
    """How the rows in a target's cache were computed, kept up to date as blocks go in."""

    max_block: int
    known: Exactness
    canonical: list[int] = field(default_factory=list)  # the cached prompt prefix in fresh blocks
    # The cached prefix whose every row a block of at most prompt_rows rows computed.
    one_token_like: int = 0
    # The cached prefix whose every row a block of pieces_from+ rows computed, from position 0
    # or on such rows.
    large_blocks: int = 0

    def exact_keep(self, prompt: Sequence[int], keep: int) -> int:
        """How much of the cached prefix (keep tokens match) gives a fresh evaluation's bits."""
        rows = len(prompt) - 1
        if keep == len(self.canonical) == rows:
            return keep
        step = self.max_block
        kept = [min(keep, len(self.canonical) // step * step) // step * step]
        if self.sums_as_one_token(rows):
            kept.append(min(keep, self.one_token_like))
        large = self.known.pieces_from
        if large is not None and large <= rows <= step:  # fresh: one block of large pieces
            kept.append(min(keep, self.large_blocks, rows - large))
        return max(kept)

    def sums_as_one_token(self, rows: int) -> bool:
        """Whether a block of `rows` rows gives one-token passes' bits on the target's kernels."""
        limit = self.known.prompt_rows
        return limit is None or rows <= limit

    def prompt_in(self, prompt: Sequence[int], keep: int, exact: int, todo: int) -> None:
        """prompt[keep:keep + todo] went in after the kept prefix, in eval_chunked's blocks."""
        step, past = self.max_block, keep
        self.one_token_like, self.large_blocks = min(self.one_token_like, keep), min(self.large_blocks, keep)
        for block in [step] * (todo // step) + ([todo % step] if todo % step else []):
            self.kept(past, block, block)
            past += block
        # From a fresh block boundary the blocks are the fresh ones; otherwise only what was
        # fresh before the reused prefix stays so.
        self.canonical = list(prompt[:-1] if keep == exact else prompt[:exact])

    def kept(self, past: int, rows: int, block: int | None) -> None:
        """The cache now holds `rows` rows after `past`, computed in a block of `block` rows
        (None: a tree's pass)."""
        if self.one_token_like >= past and block is not None and self.sums_as_one_token(block):
            self.one_token_like = past + rows
        else:
            self.one_token_like = min(self.one_token_like, past)
        large = self.known.pieces_from
        if self.large_blocks >= past and block is not None and large is not None and block >= large:
            self.large_blocks = past + rows
        else:
            self.large_blocks = min(self.large_blocks, past)
