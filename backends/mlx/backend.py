"""One mlx-lm model with its own KV cache behind the Backend protocol.

A verify block is one forward pass over k tokens; rollback trims the KV cache (mlx-lm's
`trim`), which only moves an offset, so a rejected draft costs nothing to undo. A cache
that cannot be trimmed (a hybrid's recurrent state, a sliding window that has wrapped) goes
back to a mark of its states and replays what follows (rollback.py); Qwen3.5/3.6 leave a
mark per position of a verify block, so they replay nothing. The output head runs only on
the rows the caller asked for: prefill blocks skip it, decode steps apply it to one row.

Self-drafters are made in memory from the loaded target (no derived files, no second
download), full Backends the engine drafts with like any separate draft model:
- qspec[:BITS]: a copy of the target requantized with MLX's affine quantization to 2, 3, 4,
  5, 6 or 8 bits. Without BITS: 4 for a target wider than 4 bits, else 2. Norms and biases
  are shared with the target, only the matrices are copied.
- layerskip[:L]: the target's first L blocks, then its final norm and head (early exit);
  it shares every weight with the target and has a KV cache of its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, NotRequired, TypedDict, Unpack, cast

import mlx.core as mx
import numpy as np
from mlx.nn.layers.base import Module
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache

from localspec.control.selfdraft import early_exit_drafter
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend, Capabilities, Logits, LogitsMode, ModelInfo, TextFromVocab
from localspec.core.records import check_block, check_open, check_rollback
from localspec.drafters import BlockDrafter, cannot_attach

from ..vocab import Vocab
from .modules import (
    compute_stream,
    device_name,
    eval_parameters,
    gemma4_model,
    low_bit_copy,
    materialize,
    parameter_bytes,
    parameter_count,
    qspec_bits,
    quantize_like,
    text_model,
)
from .rollback import MARK_LIMIT, StateMarks, needs_marks, stepwise_hidden, stepwise_model

# mlx-lm modules whose Model is exactly embed -> blocks(h, mask, cache) -> norm -> head, so a
# forward pass can stop early (layer skip) and the head can run on chosen rows only.
SPLITTABLE = frozenset({"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3"})


def splittable(model: Module) -> bool:
    inner = getattr(model, "model", None)
    return (
        type(model).__module__ in SPLITTABLE
        and inner is not None
        and getattr(inner, "swa_idx", None) is None  # sliding-window layers need their own mask
        and getattr(inner, "pipeline_size", 1) == 1
    )


class Forward:
    """Tokens -> hidden states -> logits for one model, optionally through its first
    n_layers blocks only (early exit reusing the final norm and head)."""

    def __init__(self, model: Module, n_layers: int | None = None, stepwise: bool | None = None) -> None:
        self.model = model
        self.split = splittable(model)
        # Qwen3.5/3.6 run through stepwise_hidden: per-position recurrent states on request.
        self.stepwise = stepwise_model(model) if stepwise is None else stepwise
        # Gemma 4 runs its text model to the final norm, so an MTP assistant can read the hidden states.
        self.gemma4 = gemma4_model(model)
        total = len(model.layers)
        if n_layers is not None and not (self.split and 1 <= n_layers <= total):
            raise InvalidRequestError(f"cannot stop {type(model).__module__} after {n_layers} of {total} blocks")
        self.n_layers = n_layers or total

    def unused(self) -> tuple[str, ...]:
        """Parameter path prefixes this pass never reads: the blocks after an early exit."""
        return tuple(f"model.layers.{i}." for i in range(self.n_layers, len(self.model.layers)))

    def make_cache(self) -> list[Any]:
        return list(make_prompt_cache(self.model))[: self.n_layers]

    def hidden(self, ids: mx.array, cache: list[Any], steps: dict[int, list[list[mx.array]]] | None = None) -> mx.array:
        """(1, n) ids -> (1, n, d) final-norm hidden states; logits when the model cannot be split.
        steps: filled with the recurrent layers' state after each token (stepwise models only)."""
        if self.stepwise:
            return stepwise_hidden(self.model.model, ids, cache, steps)
        if self.gemma4:
            normed_text: mx.array = text_model(self.model).model(ids, cache=cache)
            return normed_text
        if not self.split:
            out: mx.array = self.model(ids, cache=cache)
            return out
        inner = self.model.model
        h = inner.embed_tokens(ids)
        mask = create_attention_mask(h, cache[0])
        for layer, layer_cache in zip(inner.layers[: self.n_layers], cache, strict=True):
            h = layer(h, mask, layer_cache)
        normed: mx.array = inner.norm(h)
        return normed

    def head(self, h: mx.array) -> mx.array:
        if not (self.split or self.stepwise or self.gemma4):
            return h
        owner = text_model(self.model)  # qwen3_5 and gemma4 wrap their text model
        if hasattr(owner, "lm_head"):
            out: mx.array = owner.lm_head(h)
        else:
            out = owner.model.embed_tokens.as_linear(h)
        cap = getattr(owner, "final_logit_softcapping", None) if self.gemma4 else None
        return mx.tanh(out / cap) * cap if cap else out


class Described(TypedDict):
    """What an MlxBackend is told of its model: its name and file, its architecture, the context
    it serves, the longest block (512) and the calibration key's extra fields."""

    name: str
    path: str
    architecture: str
    n_ctx: int
    max_block: NotRequired[int]
    extra: NotRequired[dict[str, str] | None]


class MlxBackend(TextFromVocab):
    """An mlx-lm model, its tokenizer and a KV cache of its own."""

    vocab: Vocab

    def __init__(self, forward: Forward, vocab: Vocab, **described: Unpack[Described]) -> None:
        name, path, architecture = described["name"], described["path"], described["architecture"]
        n_ctx, max_block, extra = described["n_ctx"], described.get("max_block", 512), described.get("extra")
        self.forward = forward
        self.vocab = vocab
        materialize(forward.model)
        self._cache = forward.make_cache()
        self._tokens: list[int] = []
        # True while the cache may run ahead of self._tokens (an exception such as Ctrl+C
        # between the forward pass and the record); the next call trims it back.
        self._unrecorded = False
        self._closed = False
        model = forward.model
        self._n_vocab = int(self._probe_vocab())
        # Recurrent state or a sliding window: rollback restores a mark and replays (rollback.py).
        self._marks = StateMarks() if needs_marks(self._cache) else None
        # The final-norm hidden state per cached position, kept once an MTP head reads them.
        self._hidden_rows: np.ndarray | None = None
        # The build keys cached calibrations: another mlx has other kernels.
        extras = {"device": device_name(), "build": f"mlx {version('mlx')}", **(extra or {})}
        self.info = ModelInfo(
            name=name,
            path=path,
            backend="mlx",
            architecture=architecture,
            n_ctx=n_ctx,
            n_vocab=self._n_vocab,
            size_bytes=parameter_bytes(model, forward.unused()),
            n_params=parameter_count(model, forward.unused()),
            n_layers=forward.n_layers,
        )
        self.capabilities = Capabilities(max_block=max_block, device=extras["device"], extra=extras)

    def _probe_vocab(self) -> int:
        model = self.forward.model
        args = getattr(getattr(model, "language_model", model), "args", None)  # qwen3_5: its text model's
        size = getattr(args, "vocab_size", None)
        return int(size) if size else len(self.vocab.texts)

    @property
    def model(self) -> Module:
        return self.forward.model

    # -- description ------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    # -- text (TextFromVocab answers the rest from self.vocab) --------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        check_open(self._closed, self.info.name)
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    # -- evaluation -------------------------------------------------------------------------

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        check_open(self._closed, self.info.name)
        check_block(tokens, logits, self.info, self.capabilities, len(self._tokens))
        n = len(tokens)
        if n == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        ids = np.asarray(tokens, dtype=np.int64)
        self._resync()
        past = len(self._tokens)
        # Short blocks (verify blocks, drafts) leave a mark per position where the model can.
        steps: dict[int, list[list[mx.array]]] | None = {} if self._marks and n < MARK_LIMIT else None
        with mx.stream(compute_stream()):
            if self._marks is not None:
                self._marks.before_block(past, self._cache, n)
            self._unrecorded = True
            h = self.forward.hidden(mx.array(ids.astype(np.int32))[None], self._cache, steps)
            self._tokens.extend(int(t) for t in tokens)
            self._unrecorded = False
            if self._marks is not None and steps:
                self._marks.after_block(past, self._cache, steps)
            if self._hidden_rows is not None:
                self._hidden_rows[past : past + n] = np.array(h[0].astype(mx.float32))
            # The cache is evaluated with the output every time, so no lazy graph outlives a call
            # (a later call may come from another thread, and MLX streams are per thread).
            state = cast(list[tuple[str, Any]], tree_flatten([c.state for c in self._cache]))
            arrays = [v for _, v in state if isinstance(v, mx.array)]
            if logits == "none":  # only the cache is wanted: the last block's tail and the head are skipped
                mx.eval(arrays)
                return np.empty((0, self._n_vocab), dtype=np.float32)
            rows = h[:, -1:, :] if logits == "last" else h
            out = self.forward.head(rows)[0].astype(mx.float32)
            mx.eval(out, arrays)
        return np.array(out, copy=True)

    def _resync(self) -> None:
        """Trim a cache that ran ahead of the token record back to it (see _unrecorded)."""
        if not self._unrecorded:
            return
        self._unrecorded = False
        n = len(self._tokens)
        if self._marks is not None:
            self._rewind(n)
        elif n == 0:
            self._cache = self.forward.make_cache()
        else:
            for c in self._cache:
                c.trim(max(0, int(getattr(c, "offset", n)) - n))

    def rollback(self, n: int) -> None:
        check_open(self._closed, self.info.name)
        check_rollback(n)
        self._resync()
        drop = len(self._tokens) - n
        if drop <= 0:
            return
        if n == 0:
            self._cache = self.forward.make_cache()  # a fresh cache is always a valid rollback
            if self._marks is not None:
                self._marks.clear()
        elif self._marks is not None:
            self._rewind(n)
            return
        else:
            for c in self._cache:
                c.trim(drop)
        del self._tokens[n:]

    def _rewind(self, n: int) -> None:
        """Keep n tokens of a cache with untrimmable parts: back to the latest mark at or before
        n (an empty cache when there is none), then replay the kept tokens after it."""
        assert self._marks is not None
        kept = self._tokens[:n]
        at = self._marks.restore(self._cache, n)
        if at is None:
            self._cache, at = self.forward.make_cache(), 0
            self._marks.replayed += n
        del self._tokens[at:]
        step = self.capabilities.max_block
        for start in range(at, n, step):
            self.eval_block(kept[start : start + step], "none")

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """The drafter for strategy f"{kind}:{option}" (localspec.core.protocol.SelfDrafting); its
        capabilities.extra["self_draft"] is the resolved label (e.g. "qspec:2", "layerskip:15")."""
        if kind == "mtp":
            return self.mtp_head()
        if kind == "qspec":
            bits = qspec_bits(self.model, option)
            return self.derive(Forward(low_bit_copy(self.model, bits)), f"qspec:{bits}")
        if not self.forward.split:
            raise InvalidRequestError(
                f"layerskip on MLX needs a llama, qwen2 or qwen3 model; "
                f"{type(self.model).__module__} cannot stop early",
                "use --strategy qspec or ngram with this model",
            )
        return early_exit_drafter(
            self, option, self.forward.n_layers, lambda k: self.derive(Forward(self.model, k), f"layerskip:{k}")
        )

    def mtp_head(self) -> Backend:
        """The model's own MTP block (Qwen3.5/3.6's mtp.* weights) as a drafter (strategy mtp)."""
        from .mtp import MlxMtpHead, MtpBlock, mtp_weights, stack_experts

        if self.forward.gemma4:
            raise InvalidRequestError(
                f"{self.info.name} has no MTP head of its own: Gemma 4 drafts with its assistant, a model beside it",
                "pull the pair with it (`localspec pull gemma-4-12b-assistant --backend mlx`), give its MLX "
                "folder as --draft-model (gemma-4-E4B-it-assistant-bf16 for gemma-4-E4B-it), or --strategy ngram",
            )
        weights = mtp_weights(self.info.path) if self.forward.stepwise and os.path.isdir(self.info.path) else {}
        if not weights:
            raise InvalidRequestError(
                f"{self.info.name} has no MTP head: its folder keeps no mtp.* weights",
                "use an MLX conversion that keeps them (mlx-community/Qwen3.6-27B-MTP-bf16, "
                "Qwen3.6-35B-A3B-MTP-*), or --strategy ngram",
            )
        text_args = text_model(self.model).args
        block = MtpBlock(text_args)  # a MoE layer where the model has experts (qwen3_5_moe)
        weights = stack_experts(weights)
        quantize_like(block, weights)  # an MLX-quantized head loads as it is stored
        try:
            block.load_weights(list(weights.items()), strict=True)
        except ValueError as exc:
            kind = "MoE" if getattr(text_args, "num_experts", 0) else "dense"
            raise InvalidRequestError(
                f"{self.info.name}'s mtp.* weights do not fit a {kind} Qwen3.5 MTP block: {' '.join(str(exc).split())}",
                "use --backend llamacpp with the model's *-MTP-GGUF for --strategy mtp, or --strategy ngram",
            ) from exc
        eval_parameters(block)
        block.eval()
        return MlxMtpHead(self, block)

    def assistant_head(self, path: str) -> Backend:
        """A Gemma 4 assistant folder drafting for this target (backends/mlx/assistant.py)."""
        from .assistant import load_assistant

        return load_assistant(path, self)

    def attach_head(self, kind: str, path: str) -> Backend:
        """DrafterHost: a Gemma 4 assistant's MLX folder; MLX runs no EAGLE-3 head."""
        if kind != "assistant":
            raise cannot_attach(kind, path, self.info.backend)
        return self.assistant_head(path)

    def attach_block_drafter(self, path: str) -> BlockDrafter:
        """DrafterHost: refused, MLX runs no DFlash drafter."""
        raise cannot_attach("dflash", path, self.info.backend)

    def hidden_states(self) -> np.ndarray:
        """Final-norm hidden states by position, kept from now on; the cache starts over, as
        positions decoded before have none."""
        if self._hidden_rows is None:
            width = int(text_model(self.model).args.hidden_size)
            self._hidden_rows = np.zeros((self.info.n_ctx, width), dtype=np.float32)
            self.rollback(0)
        return self._hidden_rows

    def derive(self, forward: Forward, label: str) -> MlxBackend:
        """A backend over another forward pass (a self-drafter) sharing this one's tokenizer."""
        return MlxBackend(
            forward,
            self.vocab,
            name=f"{self.info.name} [{label}]",
            path=self.info.path,
            architecture=self.info.architecture,
            n_ctx=self.info.n_ctx,
            max_block=self.capabilities.max_block,
            extra=self.capabilities.extra | {"self_draft": label},
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cache = []
        self._tokens = []
