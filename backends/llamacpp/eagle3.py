"""An EAGLE-3 head drafting for its target on llama.cpp (strategy eagle3, a GGUF of architecture eagle3).

The head is one decoder block in a file of its own (converted by llama.cpp's
convert_hf_to_gguf.py with --target-model-dir). It reads the inputs of three of its target's
layers (low, middle, high: the GGUF's eagle3.target_layers, captured by features.py),
concatenated and projected to its own width by its fc layer, which llama.cpp runs as an
ENCODE pass on the head's context: g_q. Its decoder reads token x_{q+1} with g_q at cache
position q and predicts x_{q+2}; its own pre-norm output there stands in for g at positions
the target has not decoded, which is how it drafts ahead (the convention of
common/speculative.cpp's draft-eagle3). It borrows the target's token embeddings and output
head where its file has none (through ctx_other), and a head with a smaller draft vocabulary
maps it onto the target's with its d2t table inside llama.cpp's graph (the rest gets -inf).

Eagle3Head is an MTP head's sibling (both are ContextHeads, head.py) with two differences: a
token is read one cache position before its own (ContextHead.shift), and a target state is
encoded before it is read. As with an MTP head, a
position read with the head's own state is read again with the target's once the target has
decoded it, so its cache holds what a clean pass would.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp as llama
import numpy as np
from llama_cpp import llama_cpp_ext as ext

from localspec.common.gguf_header import GGUFHeader, check_gguf, diagnose_gguf, read_header
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Backend, Capabilities

from . import compute, library
from .features import EAGLE3_KIND, HiddenRows, target_layer_ids
from .head import ContextHead, LaneSeat, SharedCache, head_context

ARCHITECTURE = "eagle3"
KIND = EAGLE3_KIND

# (layer ids, the target width they were made for, the head's file, its kind) -> the rows
Features = Callable[[Sequence[int], int, str, str], HiddenRows]


class Eagle3Head(ContextHead):
    """An EAGLE-3 head drafting for its target (see the module doc)."""

    # llama.cpp's eagle3 graph computes the logits of every token of a pass and hands back its
    # first rows, however many were flagged: flagging every row (as llama.cpp's draft-dflash
    # does for its block) makes row k token k, at no cost beyond copying them.
    every_row = True

    def __init__(
        self, target: Backend, model: Any, target_ctx: Any, features: HiddenRows, file: HeadFile, cache: SharedCache
    ) -> None:
        """file: what its GGUF's header says; cache: where it sits (head.SharedCache): a context
        of its own, or a lane's sequence in the lanes' one context, where the lanes' heads draft
        in merged passes; cache.owned: the model is freed with the head (False: the host's copy)."""
        path = file.path
        merged = cache.passes
        ctx = (
            merged.ctx
            if merged is not None
            else head_context(target, model, target_ctx, llama.LLAMA_CONTEXT_TYPE_DEFAULT)
        )
        if not ctx:
            if cache.owned:
                llama.llama_model_free(model)
            raise ModelLoadError(
                f"llama.cpp could not open a context for the {KIND} {os.path.basename(path)}",
                "free memory (a smaller --ctx), or draft with --strategy ngram",
            )
        # Its output rows carry the pre-norm state of each output (and of the fc).
        width = int(llama.llama_model_n_embd(model))
        super().__init__(target, ctx, features, width, model if cache.owned else None, cache)
        self.shift = 1
        self._features = llama.llama_batch_ext_init(ctx)  # the encoder's batch
        self._ubatch = int(llama.llama_n_ubatch(ctx))
        size, params = _cost(target, model, file.borrows_output)
        self.info = replace(
            target.info,
            name=os.path.basename(path),
            path=os.path.abspath(path),
            architecture=ARCHITECTURE,
            size_bytes=size,
            n_params=params,
            n_layers=1,
        )
        extra = {**target.capabilities.extra, "self_draft": ARCHITECTURE}
        self.capabilities = Capabilities(
            max_block=target.capabilities.max_block, device=target.capabilities.device, extra=extra
        )

    def _pass(self, entries: list[tuple[int, int, bool]], at: int | None, into: dict[int, np.ndarray]) -> None:
        # x_0 is read with nothing (no g_{-1}): it predicts nothing, a flat row, and is never drafted from.
        if entries and entries[0][0] == 0:
            if 0 in into:
                into[0][:] = 0.0
            entries = entries[1:]
        if entries:
            super()._pass(entries, at, into)

    def _states_for(self, qs: list[int]) -> list[tuple[np.ndarray, bool]]:
        """g_{q-1} for each token q: encoded from the target's layers where it decoded q-1 (or
        where the head kept no state of its own there), else the head's own state."""
        known = [self._known(q - 1) for q in qs]
        encoded = [q - 1 for q, k in zip(qs, known, strict=True) if k or q - 1 not in self._own]
        g = dict(zip(encoded, self._encode(self._states.rows[encoded]), strict=True)) if encoded else {}
        own = self._own
        return [
            (g[q - 1], True) if k else (own[q - 1] if q - 1 in own else g[q - 1], False)
            for q, k in zip(qs, known, strict=True)
        ]

    def _encode(self, rows: np.ndarray) -> np.ndarray:
        """The head's fc over the target's concatenated layer inputs: one ENCODE pass per ubatch.
        It runs while a pass's rows are filled (ContextHead.fill), before the pass: in the lanes'
        one context, inside their merged pass, on the thread that runs it."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        out = np.empty((len(rows), self._width), dtype=np.float32)
        for start in range(0, len(rows), self._ubatch):
            chunk = rows[start : start + self._ubatch]
            llama.llama_batch_ext_clear(self._features)
            # The fc reads no position, but the batch's must follow the cache's, as llama.cpp's own loop numbers them.
            after = int(llama.llama_memory_seq_pos_max(self._mem, self.seq)) + 1
            for i, row in enumerate(chunk):
                embd = llama.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[0])
                idx = llama.llama_batch_ext_add_embd(self._features, self.seq, embd)
                position = llama.llama_pos(after + i)
                llama.llama_batch_ext_set_pos(self._features, idx, ctypes.byref(position))
                llama.llama_batch_ext_set_output_embd(self._features, idx, True)
            rc = compute.process(self._ctx, llama.LLAMA_PROCESS_TYPE_ENCODE, self._features)
            if rc != 0:
                raise InvalidRequestError(
                    f"the {KIND} {self.info.name}'s fc pass failed with code {rc}", "draft with --strategy ngram"
                )
            g = ext.llama_get_embeddings_nextn(self._ctx)
            out[start : start + len(chunk)] = np.ctypeslib.as_array(g, shape=(len(chunk), self._width))
        return out

    def close(self) -> None:
        if not self._closed:
            llama.llama_batch_ext_free(self._features)
        super().close()


def _cost(target: Backend, model: Any, borrows_output: bool) -> tuple[int, int]:
    """The head's bytes and parameters read per pass, with the target's output head where it
    borrows it (a pass of the head reads it as a pass of the target does)."""
    size, params = int(llama.llama_model_size(model)), int(llama.llama_model_n_params(model))
    if borrows_output:
        head = target.info.n_vocab * int(llama.llama_model_n_embd(model))
        params += head
        size += int(head * target.info.size_bytes / max(target.info.n_params, 1))
    return size, params


@dataclass(frozen=True)
class HeadFile:
    """What an EAGLE-3 GGUF's header says it needs of its target."""

    path: str
    layer_ids: tuple[int, ...]  # the target layers whose inputs it reads
    target_width: int  # the target's hidden size it was made for
    borrows_output: bool  # no output head of its own: it uses the target's


def check_head_file(header: GGUFHeader, target: Backend, n_embd: int) -> HeadFile:
    """Refuse a file that is not an EAGLE-3 head for this target's tokenizer and width, before
    llama.cpp loads it."""
    name = os.path.basename(header.path)
    fits = f"use the {KIND} made for {target.info.name} (its pair in models.toml), or --strategy ngram"
    if header.architecture != ARCHITECTURE:
        raise InvalidRequestError(
            f"{name} is not an {KIND} (its architecture is {header.architecture}, not eagle3)",
            f"give the eagle3 GGUF made for {target.info.name} with --draft-model, "
            "or --strategy draft for a draft model of its own",
        )
    meta = header.meta
    vocab = len(meta.get("tokenizer.ggml.tokens") or ())
    if vocab != target.info.n_vocab:
        raise ModelLoadError(
            f"{name} was made for a tokenizer of {vocab} tokens, {target.info.name}'s has {target.info.n_vocab}", fits
        )
    width = int(meta.get(f"{ARCHITECTURE}.embedding_length", 0))
    own = {t.name for t in header.tensors}
    borrowed = [
        what
        for what, t in (("token embeddings", "token_embd.weight"), ("output head", "output.weight"))
        if t not in own
    ]
    if borrowed and width != n_embd:
        raise ModelLoadError(
            f"{name} is {width} wide and borrows {target.info.name}'s {' and '.join(borrowed)}, "
            f"which are {n_embd} wide",
            fits,
        )
    ids = meta.get(f"{ARCHITECTURE}.target_layers") or []
    return HeadFile(
        header.path,
        tuple(int(i) for i in ids),
        int(meta.get(f"{ARCHITECTURE}.target_hidden_size", 0)),
        "output head" in borrowed,
    )


def load_eagle3_head(
    target: Backend,
    target_ctx: Any,
    features: Features,
    mparams: Any,
    path: str,
    seat: LaneSeat | None = None,
) -> Eagle3Head:
    """The EAGLE-3 head in `path`, checked against its target before llama.cpp reads it.
    seat: a lane's (lanes.py): the weights are loaded into the host's models once for every
    lane's head, which reads them and does not free them, and it drafts where seat places it."""
    if not os.path.exists(path):
        raise ModelLoadError(
            f"no such file: {path}",
            f"check the path of the {KIND} made for {target.info.name} (its pair in models.toml), "
            "or draft with --strategy ngram",
        )
    check_gguf(path)
    n_embd = int(llama.llama_model_n_embd(llama.llama_get_model(target_ctx)))
    head = check_head_file(read_header(path), target, n_embd)
    rows = features(
        head.layer_ids, head.target_width, os.path.basename(path), KIND
    )  # refuses layers or widths that do not fit

    def load() -> Any:
        model = llama.llama_model_load_from_file(os.fsencode(path), mparams)
        if not model:
            raise ModelLoadError(
                f"llama.cpp could not load the {KIND} {path}: {diagnose_gguf(path)}",
                "convert it again with llama.cpp's convert_hf_to_gguf.py --target-model-dir, or --strategy ngram",
            )
        if target_layer_ids(model) != head.layer_ids:  # what llama.cpp read is what was checked
            llama.llama_model_free(model)
            raise ModelLoadError(
                f"llama.cpp read other target layers from {path} than its header names",
                "convert the head again with llama.cpp's convert_hf_to_gguf.py, or draft with --strategy ngram",
            )
        return model

    model, owned = library.weights_once(seat.models if seat is not None else None, path, load)
    cache = seat.place(model) if seat is not None else SharedCache(owned=owned)
    return Eagle3Head(target, model, target_ctx, rows, head, cache)
