"""A model's own MTP head (multi-token prediction: Qwen3.5/3.6's nextn layer) as a drafter.

The head is one extra decoder block shipped in the target's GGUF. At position q it reads the
token x_q together with the target's last hidden state at q-1, and predicts x_{q+1}; its own
hidden state then stands in for the target's at the positions the target has not decoded
yet, which is how it drafts several tokens ahead. llama.cpp runs it in a context of type MTP
that shares the target's model (ctx_other), with a KV cache for that block alone.

MtpHead is a Backend, so ModelDrafter drafts with it as with any draft model. A position it
read with its own hidden state is taken in again with the target's once the target has
decoded that position (as llama.cpp's server does after every verify pass): the head was
trained on the target's states, and its cache must hold what a clean pass would.

Gemma 4's assistant is the same idea in a file of its own (architecture gemma4-assistant):
it keeps no cache, reading the target's instead, so every guess is made at the target's
next position and nothing is ever taken back (MtpHead.shared).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import llama_cpp as llama
import numpy as np
from llama_cpp import llama_cpp_ext as ext

from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Backend, Capabilities, Logits, LogitsMode
from localspec.core.records import HeadOfTarget

from .features import HiddenRows


def head_context(target: Backend, model: Any, target_ctx: Any, ctx_type: int) -> Any:
    """A context for a drafter that reads its target's context (ctx_other), as large as the
    target's; NULL when llama.cpp cannot make it."""
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = target.info.n_ctx
    cparams.n_batch = cparams.n_ubatch = target.capabilities.max_block
    threads = int(target.capabilities.extra.get("threads", "1"))
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.ctx_type = ctx_type
    cparams.ctx_other = target_ctx
    return llama.llama_init_from_model(model, cparams)


class MtpHead(HeadOfTarget[np.ndarray]):
    """The target's MTP block, drafting for it (see the module doc)."""

    # Whether the head's graph computes its output for every token of a pass, so that a pass
    # costs the same whichever rows are outputs (EAGLE-3's; see _pass).
    every_row = False

    def __init__(
        self, target: Backend, model: Any, target_ctx: Any, states: HiddenRows, assistant: bool = False
    ) -> None:
        super().__init__(target)
        self._states = states
        self._model = model if assistant else None  # an assistant file's own model, freed on close
        ctx = head_context(target, model, target_ctx, llama.LLAMA_CONTEXT_TYPE_MTP)
        if not ctx:
            raise ModelLoadError(f"llama.cpp could not open the MTP head of {target.info.name}")
        self._ctx = ctx
        self._mem = llama.llama_get_memory(ctx)
        # Gemma 4's assistant reads the target's KV cache and keeps none of its own: every
        # guess goes to the target's next position, and nothing is ever removed from it.
        self.shared = assistant
        self.shift = 0  # a token at position q is read at the head's cache position q - shift
        ext.llama_set_embeddings_nextn(ctx, True, True)  # a row for each output only
        self._batch = llama.llama_batch_ext_init(ctx)
        self._width = states.width
        self._vocab = target.info.n_vocab
        layers = max(target.info.n_layers, 1)
        if assistant:  # a file of its own: priced by its own size (calibrate.prior_calibration)
            size, params = int(llama.llama_model_size(model)), int(llama.llama_model_n_params(model))
        else:  # one block of the target's
            size, params = target.info.size_bytes // layers, target.info.n_params // layers
        self.info = replace(target.info, name=f"{target.info.name} [mtp]", size_bytes=size, n_params=params)
        extra = {**target.capabilities.extra, "self_draft": "mtp"}
        self.capabilities = Capabilities(
            max_block=target.capabilities.max_block, device=target.capabilities.device, extra=extra
        )

    # -- drafting ---------------------------------------------------------------------------

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

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        n, past = len(tokens), self._admit(tokens, logits)
        if n == 0:
            return np.empty((0, self._vocab), dtype=np.float32)
        frontier = len(self._target.cached_tokens())  # beyond it, drafts need the head's own states
        picked = range(n) if logits == "all" else ([n - 1] if logits == "last" else [])
        out = np.empty((len(picked), self._vocab), dtype=np.float32)
        into = {past + k: out[row] for row, k in enumerate(picked)}  # logits go straight there
        try:
            if self.shared:
                for k, token in enumerate(tokens):
                    if past + k >= frontier or past + k in into:  # the target's cache holds the others
                        self._pass([(past + k, int(token), True)], min(past + k, frontier), into)
            else:
                wanted = [past + k in into or past + k >= frontier for k in range(n)]
                self._pass([(past + k, int(t), wanted[k]) for k, t in enumerate(tokens)], None, into)
        except InvalidRequestError:
            del self._tokens[past:]
            raise
        return out

    def _pass(self, entries: list[tuple[int, int, bool]], at: int | None, into: dict[int, np.ndarray]) -> None:
        """One pass over (position, token, output?) entries, each read with the state before it;
        `at`: the position a shared-cache head writes every token to (its target's next one).
        Keeps the outputs' states, and writes their logits into the rows `into` holds for them.

        llama.cpp hands back a pass's first rows where a graph computes them for every token
        (Qwen3.5's MTP states, EAGLE-3's logits), whichever rows were flagged; so every row of
        a pass is an output, or none is. The outputs are always the last entries (the tokens
        the target has not decoded, or the one asked for): the rest go in a pass of their own,
        unless the graph computes every row anyway (every_row)."""
        split = 0 if self.every_row else next((i for i, (_, _, out) in enumerate(entries) if out), len(entries))
        if split:
            self._run(entries[:split], at, into, outputs=False)
        if split < len(entries):
            self._run(entries[split:], at, into, outputs=True)

    def _run(
        self, entries: list[tuple[int, int, bool]], at: int | None, into: dict[int, np.ndarray], outputs: bool
    ) -> None:
        """One llama.cpp pass over the entries, every row an output or none (see _pass)."""
        llama.llama_batch_ext_clear(self._batch)
        states: list[np.ndarray] = []  # kept alive until the pass has read them
        read = self._states_for([q for q, _, _ in entries])
        for (q, token, _), (state, exact) in zip(entries, read, strict=True):
            idx = llama.llama_batch_ext_add_token(self._batch, 0, token)
            position = llama.llama_pos(q - self.shift if at is None else at)
            llama.llama_batch_ext_set_pos(self._batch, idx, ctypes.byref(position))
            states.append(np.ascontiguousarray(state, dtype=np.float32))
            embd = llama.llama_embd(states[-1].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self._width)
            llama.llama_batch_ext_set_embd_token(self._batch, idx, embd)
            (self._guessed.discard if exact else self._guessed.add)(q)
            llama.llama_batch_ext_set_output_logits(self._batch, idx, outputs)
        rc = llama.llama_process(self._ctx, llama.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise InvalidRequestError(f"{self.info.name}'s pass failed with code {rc} at position {entries[0][0]}")
        for k, (q, _, output) in enumerate(entries):  # both calls take the token's index in the batch
            if output:
                state_ptr = ext.llama_get_embeddings_nextn_ith(self._ctx, k)
                self._own[q] = np.ctypeslib.as_array(state_ptr, shape=(self._width,)).copy()
            if q in into:
                into[q][:] = np.ctypeslib.as_array(llama.llama_get_logits_ith(self._ctx, k), shape=(self._vocab,))

    def _forget(self, position: int) -> None:
        llama.llama_memory_seq_rm(self._mem, 0, max(position - self.shift, 0), -1)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        llama.llama_batch_ext_free(self._batch)
        llama.llama_free(self._ctx)
        if self._model is not None:
            llama.llama_model_free(self._model)
