"""Whether a GPU device's kernels give a verify block the logits of one-token passes, checked
on the device when a model loads there.

The CPU's kernels are known one by one (kernels.py); a device's are not (CUDA, Vulkan on AMD,
Intel or Mesa's software device each pick kernels by block size: llama.cpp's Vulkan backend
switches matrix-vector to matrix-matrix products past 8 rows, and lavapipe's sums part from 2
or 3). So the load measures it: a short text's tokens one at a time, then blocks of 2, 3, ...
of the same tokens over the same cache, row for row, bit for bit, behind 4 and behind 24
tokens. Blocks up to the first size that parts are what a run may verify and still be plain
decoding's by construction (bit_exact); a block past them, or past the sizes checked, is
reported inexact. Two short contexts are checked, not every context length's attention kernels.
"""

from __future__ import annotations

import numpy as np

from localspec.core.protocol import Backend, Exactness

# Block sizes checked: up to a draft of 15 (DFlash's blocks of 16), past Vulkan's 8-row switch.
CHECKED_ROWS = 16
# The caches the blocks go onto: a few tokens, and a few more (a device can part at one
# position and not at another: lavapipe's blocks of 2 matched behind 12 tokens, not behind 4).
TEXT = "The three largest cities of France are Paris, Marseille and Lyon. The three largest cities of Italy are"
HEADS = (4, 24)
FIRST_STAGE = 4


def identical_block_rows(backend: Backend, up_to: int = CHECKED_ROWS) -> int:
    """The largest k <= up_to such that blocks of 1..k tokens each gave, row for row, the
    logits k one-token passes give over the same tokens and cache, behind each of HEADS
    (1 at least: a block of one is a one-token pass). Leaves the cache empty."""
    tokens = backend.tokenize(TEXT, add_special=True, parse_special=False)
    tokens = (tokens * (1 + (max(HEADS) + up_to) // max(len(tokens), 1)))[: max(HEADS) + up_to]
    rows = up_to
    try:
        for head in HEADS:  # the second position checks only the sizes the first left standing
            rows = _identical_behind(backend, tokens[:head], tokens[head : head + rows])
        return rows
    finally:
        backend.rollback(0)


def _identical_behind(backend: Backend, head: list[int], text: list[int]) -> int:
    rows = 1
    # Blocks of 2-4 first, from four one-token passes: where a device parts early (lavapipe
    # from 2 or 3 rows) the check costs a handful of passes, not len(text) of them.
    for stage in sorted({min(FIRST_STAGE, len(text)), len(text)}):
        singles = _one_token_passes(backend, head, text[:stage])
        for k in range(rows + 1, stage + 1):
            backend.rollback(0)
            backend.eval_block(head, "none")
            if not np.array_equal(np.asarray(backend.eval_block(text[:k], "all"), dtype=np.float32), singles[:k]):
                return k - 1
        rows = stage
    return rows


def _one_token_passes(backend: Backend, head: list[int], text: list[int]) -> np.ndarray:
    backend.rollback(0)
    backend.eval_block(head, "none")
    return np.stack([np.array(backend.eval_block([t], "all")[-1], dtype=np.float32) for t in text])


def device_exactness(backend: Backend, device: str, up_to: int = CHECKED_ROWS) -> Exactness:
    """What a run on this device may claim, from identical_block_rows: blocks of at most that
    many tokens verify as one-token passes (Exactness.rows, and prompt_rows for reused prefixes)."""
    rows = identical_block_rows(backend, up_to)
    if rows >= up_to:
        why = f"blocks of more than {up_to} tokens were not checked on {device}"
    else:
        why = f"on {device} a block of {rows + 1} tokens gave other logits than one-token passes (checked at load)"
    return Exactness(None, why, rows=rows, prompt_rows=rows, prompt_why=why)
