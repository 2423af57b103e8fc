"""A model's own MTP head (multi-token prediction: Qwen3.5/3.6's nextn layer) as a drafter.

The head is one extra decoder block shipped in the target's GGUF. At position q it reads the
token x_q together with the target's last hidden state at q-1, and predicts x_{q+1}; its own
hidden state then stands in for the target's at the positions the target has not decoded
yet, which is how it drafts several tokens ahead. llama.cpp runs it in a context of type MTP
that shares the target's model (ctx_other), with a KV cache for that block alone.

MtpHead is a Backend (a ContextHead, head.py), so ModelDrafter drafts with it as with any draft model. A position it
read with its own hidden state is taken in again with the target's once the target has
decoded that position (as llama.cpp's server does after every verify pass): the head was
trained on the target's states, and its cache must hold what a clean pass would.

Gemma 4's assistant is the same idea in a file of its own (architecture gemma4-assistant):
it keeps no cache, reading the target's instead, so every guess is made at the target's
next position and nothing is ever taken back (MtpHead.shared).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import llama_cpp as llama
import numpy as np

from localspec.core.errors import ModelLoadError
from localspec.core.protocol import Backend, Capabilities

from .features import HiddenRows
from .head import ContextHead, SharedCache, head_context


class MtpHead(ContextHead):
    """The target's MTP block, drafting for it (see the module doc)."""

    def __init__(
        self, target: Backend, model: Any, target_ctx: Any, states: HiddenRows, cache: SharedCache | None = None
    ) -> None:
        """cache: where it sits (head.SharedCache): a Gemma 4 assistant's file, reading the
        target's cache as it says, or a lane's MTP block in the lanes' one context."""
        if cache is not None and cache.passes is not None:  # the lanes' one context
            ctx = cache.passes.ctx
        else:
            streams = cache.streams if cache is not None else 1
            ctx = head_context(target, model, target_ctx, llama.LLAMA_CONTEXT_TYPE_MTP, streams)
        if not ctx:
            raise ModelLoadError(f"llama.cpp could not open the MTP head of {target.info.name}")
        owned = cache is not None and cache.owned  # else the target's own block, or a lanes' copy
        super().__init__(target, ctx, states, states.width, model if owned else None, cache)
        # Gemma 4's assistant reads the target's KV cache and keeps none of its own: every
        # guess goes to the target's next position, and nothing is ever removed from it.
        self.shared = cache is not None and cache.reads_target
        layers = max(target.info.n_layers, 1)
        if self.shared:  # a file of its own: priced by its own size (calibrate.prior_calibration)
            size, params = int(llama.llama_model_size(model)), int(llama.llama_model_n_params(model))
        else:  # one block of the target's
            size, params = target.info.size_bytes // layers, target.info.n_params // layers
        self.info = replace(target.info, name=f"{target.info.name} [mtp]", size_bytes=size, n_params=params)
        extra = {**target.capabilities.extra, "self_draft": "mtp"}
        self.capabilities = Capabilities(
            max_block=target.capabilities.max_block, device=target.capabilities.device, extra=extra
        )

    def _states_for(self, qs: list[int]) -> list[tuple[np.ndarray, bool]]:
        """The state each of these positions is read with, and whether it is the target's."""
        return [self._state_before(q) for q in qs]

    def _state_before(self, q: int) -> tuple[np.ndarray, bool]:
        """The hidden state x_q is read with (h_{q-1}), and whether it is the target's."""
        if q == 0:
            return np.zeros(self._width, dtype=np.float32), True  # as llama.cpp starts
        if self._known(q - 1):
            return self._states.rows[q - 1], True
        own = self._own.get(q - 1)
        if own is None:  # the head gave no output there: nothing better than the target's row
            return self._states.rows[q - 1], False
        return own, False
