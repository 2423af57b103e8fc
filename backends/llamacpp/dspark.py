"""A DSpark drafter (DeepSeek's DeepSpec; llama.cpp's `draft-dspark`): a DFlash drafter whose
block logits a low-rank Markov head biases, position by position, with the token before.

The file is a `dflash` GGUF that carries `markov_w1` and `markov_w2` (and perhaps a confidence
head, `conf_proj`); llama.cpp's dflash graph (src/models/dflash.cpp) adds the bias inside the
block pass, chaining each position on the argmax of the one before, so a block still costs one
pass. Everything else is DFlash's (dflash.py): the target's layers injected into the drafter's
cache, the block pass, the cache that never runs ahead of the committed text.

Two layouts, as the GGUF's dflash.sample_from_anchor says (absent: true, DeepSpec's own):
anchor-first, where the anchor's own row guesses the next token and a block of `block` tokens
guesses `block`; and bonus-anchor (SpecForge's exports), where, as in DFlash, the anchor's row
guesses nothing and the mask rows guess `block - 1`.

The Markov chain follows argmax whatever the sampling (llama.cpp's graph takes no sampled
token), so at T > 0 position i+1's law is conditioned on position i's argmax, not on the token
drawn there. It is still the law the token at i+1 is drawn from, given the context alone, which
is all the rejection rule needs: sampling stays exact, only acceptance is what the chain makes it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from localspec.common.gguf_header import check_gguf, read_header

from . import library
from .dflash import DFlashDrafter, FeatureTarget, load_dflash_model
from .head import LaneSeat, SharedCache

llama = library.llama


class DSparkDrafter(DFlashDrafter):
    """A DSpark drafter reading its target's layers (see the module doc)."""

    name = "dspark"

    def __init__(
        self, target: FeatureTarget, target_ctx: Any, model: Any, path: str, threads: int, cache: SharedCache
    ) -> None:
        # Before the pass is timed (DFlashDrafter.__init__): which row guesses first.
        self.first_row = 0 if _anchor_first(model) else 1
        super().__init__(target, target_ctx, model, path, threads, cache)


def _anchor_first(model: Any) -> bool:
    """Whether the anchor's own row guesses (dflash.sample_from_anchor; llama.cpp takes its
    absence as true)."""
    buf = ctypes.create_string_buffer(16)
    if llama.llama_model_meta_val_str(model, b"dflash.sample_from_anchor", buf, len(buf)) < 0:
        return True
    return buf.value == b"true"


def block_kind(path: str) -> str:
    """Which block drafter a GGUF holds: "dspark" (a DFlash file with a Markov head), else "dflash"."""
    check_gguf(path)
    return "dspark" if read_header(path).block_kind == "dspark" else "dflash"


def load_block_drafter(
    target: FeatureTarget, target_ctx: Any, path: str, kind: str, gpu_layers: int, seat: LaneSeat | None = None
) -> DFlashDrafter:
    """The `kind` ("dflash", "dspark") drafter in `path` drafting blocks for `target`, refused
    with what to use instead when the file is not one. seat: a lane's (lanes.py): the weights
    are loaded into the host's models once for every lane's drafter, which reads them and does
    not free them, and it drafts where seat places it."""
    models = seat.models if seat is not None else None
    model, owned = library.weights_once(models, path, lambda: load_dflash_model(path, gpu_layers, kind))
    cache = seat.place(model) if seat is not None else SharedCache(owned=owned)
    made = DSparkDrafter if kind == "dspark" else DFlashDrafter
    threads = int(target.capabilities.extra.get("threads", "1"))
    return made(target, target_ctx, model, path, threads, cache)
