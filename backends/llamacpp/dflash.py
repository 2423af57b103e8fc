"""A DFlash drafter (z-lab's block-diffusion drafter; llama.cpp's `dflash` architecture).

It reads the inputs of a few of its target's layers (its GGUF's target_layers), fused by its
`fc` layer and written into its own KV cache as keys and values at the target's positions
("injected"), and proposes a whole block in one non-causal pass over [anchor, mask, mask,
...]: the anchor is the target's last token, each mask position's logits guess one token
further. These are the calls llama.cpp's own draft-dflash uses (common/speculative.cpp):
embedding batches through llama_process to inject, a token batch for the block, non-causal
attention, the target's embeddings and head shared through ctx_other where the drafter
ships none.

A Drafter of its own rather than a Backend under ModelDrafter: a model drafter guesses a token,
reads it back and guesses the next, while a block comes from one pass whatever its length. So
the controller prices it as one pass (AdaptiveDraftLength.draft_seconds_per_pass) and chooses
how much of the block to verify from the measured acceptance at each position: the pass always
runs at the trained block size, and a block is cut short where the rest would not pay.

The cache holds injected features for the committed text only: positions are injected just
before a block is drafted, once the target has kept their tokens, and the block's own keys
and values are dropped after its pass. Nothing a verify pass rejected ever reaches it.

A lane's drafter (`serve --parallel`, lanes.py) keeps that cache as its sequence of one
context for every lane's: its block goes in a pass with the other lanes' blocks (fill, read;
head_passes.py), and its injections and rollbacks run alone between passes.

On a prompt holding an image (vision.py) the image's positions are injected as any others:
their features are the target's, decoded from the image's rows, so the drafter sees the
image through the target and needs no projector of its own.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np

from localspec.common.gguf_header import check_gguf, diagnose_gguf, read_header
from localspec.core.drafting import Draft, common_prefix
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Capabilities, ModelInfo
from localspec.core.sampling import Distribution, SamplingConfig
from localspec.core.tree import alternatives, top_k_branches
from localspec.drafters.draw import draw

from . import compute, library
from .features import HiddenRows, target_layer_ids
from .head import DRAFTER_ROWS, Entries, SharedCache

llama = library.llama
R = TypeVar("R")

# The block llama.cpp assumes where the GGUF names none (common/speculative.cpp).
DEFAULT_BLOCK = 16
# Runner-ups a branching position offers (its top-k beside the drafted token).
ALTERNATIVES = 1


class FeatureTarget(Protocol):
    """What a DFlash drafter needs of its target (LlamaCppBackend)."""

    info: ModelInfo
    capabilities: Capabilities

    def cached_tokens(self) -> Sequence[int]: ...

    def layer_features(self, ids: Sequence[int], width: int, drafter: str, kind: str) -> HiddenRows: ...


def load_dflash_model(path: str, gpu_layers: int, kind: str = "dflash") -> Any:
    """The drafter's llama_model, refused with a clear message when it is not a GGUF of `kind`
    ("dflash", or "dspark": a dflash file with a Markov head, backends/llamacpp/dspark.py)."""
    check_gguf(path)
    name, found = os.path.basename(path), read_header(path)
    if found.block_kind != kind:
        raise InvalidRequestError(*_wrong_kind(name, kind, found.block_kind, found.architecture))
    # This machine's load options: llama.cpp's defaults put a quantized drafter in the AMX
    # buffer, whose tiles fault on a VM that advertises AMX without running it.
    model = llama.llama_model_load_from_file(os.fsencode(path), library.model_params(gpu_layers))
    if not model:
        raise ModelLoadError(
            f"llama.cpp could not load {path}: {diagnose_gguf(path)}",
            f"download the {KINDS[kind]} again, or draft with --strategy ngram",
        )
    return model


# What each block drafter is called in messages, by strategy.
KINDS = {"dflash": "DFlash drafter", "dspark": "DSpark drafter"}


def block_size(model: Any) -> int:
    """The tokens of a block the drafter's GGUF was trained to draft (llama.cpp's default where
    it names none)."""
    buf = ctypes.create_string_buffer(32)
    if llama.llama_model_meta_val_str(model, b"dflash.block_size", buf, len(buf)) >= 0:
        return max(2, int(buf.value or DEFAULT_BLOCK))
    return DEFAULT_BLOCK


def _wrong_kind(name: str, kind: str, found: str | None, architecture: str) -> tuple[str, str]:
    """The refusal of a file that is not the block drafter asked for, and what to run it with."""
    if found is None:
        return (
            f"{name} is not a {KINDS[kind]} (its architecture is {architecture!r})",
            f"give a {KINDS[kind]} GGUF (architecture dflash) with --strategy {kind}, or use it with --strategy draft",
        )
    what = "a DFlash drafter with DSpark's Markov head" if found == "dspark" else "a DFlash drafter with no Markov head"
    return f"{name} is {what}, not a {KINDS[kind]}", f"run it with --strategy {found}"


class DFlashDrafter:
    """A DFlash drafter reading its target's layers (see the module doc)."""

    name = "dflash"
    off_notice: str | None = None
    # The block pass's first row that guesses a token: DFlash's anchor row guesses nothing.
    first_row = 1

    def __init__(
        self, target: FeatureTarget, target_ctx: Any, model: Any, path: str, threads: int, cache: SharedCache
    ) -> None:
        """cache: where it sits (head.SharedCache): a context of its own, or a lane's sequence in
        the lanes' one context (cache.passes), whose calls run one drafter at a time;
        cache.owned: the model is freed with the drafter (False: its host's copy)."""
        self._target, self._model, self._owned = target, model, cache.owned
        self._shared, self.seq = cache.passes, cache.seq
        self.file = os.path.basename(path)
        self._closed = True  # until the context exists
        try:
            self._check_vocab(target)
            width = int(llama.llama_model_n_embd(model))
            self._features = target.layer_features(target_layer_ids(model), width, self.file, KINDS[self.name])
            self.block = block_size(model)
            self.most = self.block - self.first_row  # the most tokens a pass guesses
            self._mask = int(llama.llama_vocab_mask(llama.llama_model_get_vocab(model)))
            if self._mask < 0:
                raise ModelLoadError(f"{self.file} has no mask token (tokenizer.ggml.mask_token_id)", self._refit)
            self._ctx = self._context(target, target_ctx, threads)
        except BaseException:
            if cache.owned:
                llama.llama_model_free(model)
            raise
        self._closed = False
        self._mem = llama.llama_get_memory(self._ctx)
        self._batch = llama.llama_batch_ext_init(self._ctx)
        self._n_vocab = target.info.n_vocab
        self._tokens: list[int] = []  # the tokens whose target features the cache holds, by position
        # For a tree (localspec.core.tree): the first positions of a block that also offer
        # their runner-ups, `alternatives` each (the block's per-position top-k, as DDTree
        # drafts), one-token branches that the tree pricing keeps where they pay.
        self.branching = 0
        self.alternatives = ALTERNATIVES
        self.size_bytes = int(llama.llama_model_size(model))
        self.pass_seconds = self._time_pass()  # one block pass on this machine: what the controller starts from

    def _check_vocab(self, target: FeatureTarget) -> None:
        n_vocab = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(self._model)))
        if n_vocab != target.info.n_vocab:
            raise ModelLoadError(
                f"{self.file} has a vocabulary of {n_vocab} tokens, {target.info.name} one of {target.info.n_vocab}: "
                "it was made for another model",
                self._refit,
            )

    def _context(self, target: FeatureTarget, target_ctx: Any, threads: int) -> Any:
        if self._shared is not None:  # the lanes' (head.head_context), whose ubatch holds a block (lanes.py)
            llama.llama_set_causal_attn(self._shared.ctx, False)
            return self._shared.ctx
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = target.info.n_ctx
        cparams.n_batch = cparams.n_ubatch = max(self.block, DRAFTER_ROWS)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.ctx_other = target_ctx  # the target's embeddings and head, where the drafter ships none
        ctx = llama.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise ModelLoadError(f"llama.cpp could not open a context for {self.file}", self._refit)
        llama.llama_set_causal_attn(ctx, False)  # a block reads itself whole
        return ctx

    def _time_pass(self) -> float:
        """Seconds of one block pass at position 0 (the first pass builds the graph: not timed)."""
        self._pass(self._mask, 0, self.most)
        t0 = time.perf_counter()
        self._pass(self._mask, 0, self.most)
        return time.perf_counter() - t0

    # -- the cache: the target's features at committed positions ----------------------------

    def _on_context(self, fn: Callable[[], R]) -> R:
        """fn's calls on the context: in the lanes' one context, with no other lane's between."""
        return self._shared.alone(fn) if self._shared is not None else fn()

    def _rollback(self, n: int) -> None:
        if n < len(self._tokens):
            self._on_context(lambda: llama.llama_memory_seq_rm(self._mem, self.seq, n, -1))
            del self._tokens[n:]

    def _inject(self, upto: int) -> None:
        """Write the target's features at positions len(self._tokens)..upto into the cache."""
        cached = self._target.cached_tokens()
        start, upto = len(self._tokens), min(upto, len(cached))
        step = int(llama.llama_n_ubatch(self._ctx))
        for at in range(start, upto, step):
            end = min(at + step, upto)
            rows = np.ascontiguousarray(self._features.rows[at:end])
            self._on_context(partial(self._inject_rows, rows, at))
            self._tokens.extend(int(t) for t in cached[at:end])

    def _inject_rows(self, rows: np.ndarray, at: int) -> None:
        llama.llama_batch_ext_clear(self._batch)
        for k in range(len(rows)):
            row = rows[k].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            idx = llama.llama_batch_ext_add_embd(self._batch, self.seq, llama.llama_embd(row, 1, rows.shape[1]))
            position = llama.llama_pos(at + k)
            llama.llama_batch_ext_set_pos(self._batch, idx, ctypes.byref(position))
        self._process(f"injecting the target's features at position {at}")

    def _pass(self, anchor: int, at: int, wanted: int) -> np.ndarray:
        """One block pass with the anchor at position `at`: the logits of the first `wanted`
        rows that guess (from first_row: the guesses for at+1..at+wanted). The block leaves
        the cache after it. A lane's block goes in a pass with the other lanes' blocks."""
        size = min(self.block, self._target.info.n_ctx - at)
        block = [(at + k, anchor if k == 0 else self._mask, True) for k in range(size)]
        if self._shared is None:  # the rows read in place, where nothing else passes
            llama.llama_batch_ext_clear(self._batch)
            self.fill(self._batch, Entries(block, None, {}, outputs=True))
            try:
                self._process(f"the block pass at position {at}")
            finally:
                llama.llama_memory_seq_rm(self._mem, self.seq, at, -1)
            rows = np.ctypeslib.as_array(llama.llama_get_logits(self._ctx), shape=(size, self._n_vocab))
            return rows[self.first_row : self.first_row + wanted]
        out = np.empty((wanted, self._n_vocab), dtype=np.float32)
        into = {at + self.first_row + k: out[k] for k in range(wanted)}  # read straight there
        asked = Entries(block, None, into, outputs=True)
        try:
            self._shared.run(self, asked)  # read() drops the block's cells
        except BaseException:
            self._shared.drop(self, at)
            raise
        return out

    def fill(self, batch: Any, asked: Entries) -> list[np.ndarray]:
        """The block's tokens added to batch in this drafter's sequence, every row an output,
        as llama.cpp's draft-dflash asks: the dflash graph computes the head for the whole
        block and hands back its first rows, whichever were flagged."""
        for q, token, _ in asked.entries:
            idx = llama.llama_batch_ext_add_token(batch, self.seq, token)
            position = llama.llama_pos(q)
            llama.llama_batch_ext_set_pos(batch, idx, ctypes.byref(position))
            llama.llama_batch_ext_set_output_logits(batch, idx, True)
        return []

    def read(self, ctx: Any, asked: Entries, base: int) -> None:
        """A lane's block's rows that guess, out of the merged pass just run (from index base),
        into the rows asked.into holds for them; then the block's cells leave the cache (on the
        compute thread, before any other pass)."""
        for k, (q, _, _) in enumerate(asked.entries):
            if q in asked.into:
                logits = llama.llama_get_logits_ith(ctx, base + k)
                asked.into[q][:] = np.ctypeslib.as_array(logits, shape=(self._n_vocab,))
        llama.llama_memory_seq_rm(self._mem, self.seq, asked.entries[0][0], -1)

    def _process(self, what: str) -> None:
        rc = compute.process(self._ctx, llama.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise InvalidRequestError(f"{self.file}: {what} failed with code {rc}", "draft with --strategy ngram")

    # -- the Drafter protocol ----------------------------------------------------------------

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        self._live()
        self._rollback(min(common_prefix(self._tokens, context), len(context) - 1))
        if warm:
            self._inject(len(context) - 1)

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        self._live()
        at = len(context) - 1  # the anchor: the target's last token, which it has not evaluated yet
        n = min(n, self.most, self._target.info.n_ctx - at - 1)
        if n <= 0 or context[-1] < 0:  # an anchor is a token: a prompt ending on an image waits a step
            return Draft()
        self._rollback(min(common_prefix(self._tokens, context), at))
        self._inject(at)
        rows = self._pass(int(context[-1]), at, n)
        return _read_block(rows, context, cfg, rng, (min(self.branching, n), self.alternatives))

    def backlog(self, context: Sequence[int]) -> int:
        # Injecting is one cheap pass over the fused features, paid within the draft's time.
        return 0

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        self._rollback(len(context) - 1)  # the cache never runs ahead of the committed text

    def _live(self) -> None:
        if self._closed:
            raise InvalidRequestError(f"the {KINDS[self.name]} {self.file} was closed", "load the model again")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        llama.llama_batch_ext_free(self._batch)
        if self._shared is None:  # else the lanes' host frees it
            llama.llama_free(self._ctx)
        if self._owned:
            llama.llama_model_free(self._model)

    @property
    def _refit(self) -> str:
        return f"use the {KINDS[self.name]} made for this target (its pair in models.toml), or --strategy ngram"


def _read_block(
    rows: np.ndarray, context: Sequence[int], cfg: SamplingConfig, rng: np.random.Generator, top: tuple[int, int]
) -> Draft:
    """The block's guesses: each mask position's argmax, or a draw from its law shaped as the
    target's is (so the rejection rule's q is the law each token was drawn from). Positions
    are read independently: one pass gives them all, each conditioned only on the context.
    top: (positions, k): the first positions' k runner-ups, as one-token branches."""
    tokens: list[int] = []
    dists: list[Distribution] = []
    tops: list[list[int]] = []
    for i, raw in enumerate(rows):
        drawn = draw(raw, cfg, tokens, len(context) + i, rng)
        if drawn is None:
            break  # the grammar allows nothing more
        tok, dist, row = drawn
        tokens.append(tok)
        if dist is not None:
            dists.append(dist)
        if i < top[0]:
            tops.append(alternatives(row, tok, dist, top[1]))
    return Draft(tokens, None if cfg.greedy else dists, branches=top_k_branches(tokens, tops) or None)
