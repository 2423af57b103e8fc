"""Gemma 4's MTP assistant drafting for its target on MLX, as llama.cpp runs it
(src/models/gemma4-assistant.cpp, common/speculative.cpp in the vendored tree).

The assistant is a few Gemma 4 decoder layers that keep no KV cache: their queries attend
to the target's own cache (the target's last sliding layer for a sliding layer, its last
full layer for a full one, after the target's KV sharing). At the target's next position p
it reads the last accepted token x_p and the target's final-norm hidden state h_{p-1}:

    x = pre_projection([embed_target(x_p) * sqrt(d_target); h_{p-1}])
    x = layers(x, keys/values of the target at positions < p, rope at p)
    n = norm(x),  logits = n @ embed_assistant^T,  h' = post_projection(n)

h' stands in for the target's state when it drafts the next token, still at position p:
the target's cache does not grow while it drafts, so every guess is made at p (transformers'
Gemma4Assistant and llama.cpp do the same). Nothing is ever taken back from it: a rollback
only forgets the drafted tokens and their states.

The folder layout assumed (mlx-community's `gemma-4-*-assistant-*`, converted from Google's
`gemma-4-*-it-assistant`): config.json with model_type "gemma4_assistant" (or architectures
["Gemma4AssistantForCausalLM"]), "backbone_hidden_size" (the target's width) and Gemma 4's
text fields at the top or under "text_config"; safetensors with `embed_tokens.weight`,
`layers.N.{input_layernorm, self_attn.{q_proj, q_norm, o_proj}, post_attention_layernorm,
pre_feedforward_layernorm, mlp.{gate,up,down}_proj, post_feedforward_layernorm,
layer_scalar}`, `norm.weight`, `pre_projection.weight` and `post_projection.weight`, under
an optional "model." or "model.language_model." prefix. MLX-quantized matrices (a
`.scales` beside the weight) load quantized; `masked_embedding.*` (the E2B/E4B assistants'
sparse output ordering) is not used, as in llama.cpp: the full embedding gives the logits.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np
from mlx.nn.layers.base import Module
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.normalization import RMSNorm
from mlx_lm.models.cache import RotatingKVCache

from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Capabilities, Logits, LogitsMode
from localspec.core.records import HeadOfTarget

from .modules import eval_parameters, parameter_bytes, quantize_like, text_model

if TYPE_CHECKING:
    from .modules import MlxTarget

ASSISTANT_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
ASSISTANT_CLASSES = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
KINDS = ("sliding_attention", "full_attention")
UNUSED = ("masked_embedding.", "rotary_emb", ".k_proj.", ".v_proj.", ".k_norm.")


def assistant_config(folder: str) -> dict[str, Any] | None:
    """The config of a Gemma 4 assistant folder, or None for any other path."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    kinds = {config.get("model_type"), *(config.get("architectures") or [])}
    return config if kinds & {*ASSISTANT_TYPES, *ASSISTANT_CLASSES} else None


class Gemma4Assistant(Module):
    """The assistant's weights as a module (see the module doc for its pass)."""

    def __init__(self, args: Any, backbone: int) -> None:
        from mlx_lm.models import gemma4_text

        super().__init__()  # type: ignore[no-untyped-call]
        self.pre_projection = Linear(2 * backbone, args.hidden_size, bias=False)
        # Every layer is a KV-shared one: queries only, keys and values come from the target.
        self.layers = [gemma4_text.DecoderLayer(args, layer_idx=i) for i in range(args.num_hidden_layers)]  # type: ignore[no-untyped-call]
        self.norm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        self.post_projection = Linear(args.hidden_size, backbone, bias=False)

    def __call__(
        self, embedded: mx.array, hidden: mx.array, kvs: dict[str, tuple[mx.array, mx.array]], position: int
    ) -> tuple[mx.array, mx.array]:
        x = self.pre_projection(mx.concatenate([embedded, hidden], axis=-1))
        for layer in self.layers:
            x, _, _ = layer(x, None, None, shared_kv=kvs[layer.layer_type], offset=position)
        normed = self.norm(x)
        logits: mx.array = self.embed_tokens.as_linear(normed)  # type: ignore[no-untyped-call]
        state: mx.array = self.post_projection(normed)
        return logits, state


def load_assistant(folder: str, target: MlxTarget) -> MlxAssistantHead:
    """The assistant in folder, checked against its target, drafting for it."""
    from mlx_lm.models import gemma4_text

    name = os.path.basename(os.path.normpath(folder))
    config = assistant_config(folder)
    if config is None:
        raise ModelLoadError(f"{folder} is not a Gemma 4 assistant folder (its config.json says otherwise)")
    if not target.forward.gemma4:
        raise InvalidRequestError(
            f"{name} is a Gemma 4 assistant: it drafts for a gemma4 model, not {target.info.name} "
            f"({target.info.architecture})",
            "pair it with the Gemma 4 model it was made for, or use --strategy ngram",
        )
    weights = _weights(folder)
    fields = {**config, **(config.get("text_config") or {})}
    backbone = int(fields.get("backbone_hidden_size", 0))
    target_args = text_model(target.model).args
    if backbone != int(target_args.hidden_size):
        raise InvalidRequestError(
            f"{name} was made for a Gemma 4 model {backbone} wide, and {target.info.name} is "
            f"{target_args.hidden_size} wide",
            "use the assistant of the same size (E4B with E4B, 12B with 12B, 31B with 31B)",
        )
    try:
        gate = weights["layers.0.mlp.gate_proj.weight"]
        args = gemma4_text.ModelArgs.from_dict(fields)  # type: ignore[no-untyped-call]
    except (KeyError, TypeError) as exc:
        raise ModelLoadError(f"{name} is not a complete Gemma 4 assistant: {exc!r} is missing") from exc
    # KV-shared layers without per-layer inputs; the feed-forward width as the weights have it.
    args.num_kv_shared_layers = args.num_hidden_layers
    args.hidden_size_per_layer_input = 0
    args.use_double_wide_mlp = False
    args.intermediate_size = int(gate.shape[0])
    args.vocab_size = int(weights["embed_tokens.weight"].shape[0]) if "embed_tokens.weight" in weights else 0
    if args.vocab_size != target.info.n_vocab:
        raise InvalidRequestError(
            f"{name} has a vocabulary of {args.vocab_size} tokens and {target.info.name} one of {target.info.n_vocab}",
            "use the assistant made for this model",
        )
    module = Gemma4Assistant(args, backbone)
    quantize_like(module, weights)
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(
            f"{name}'s weights do not fit a Gemma 4 assistant: {' '.join(str(exc).split())}",
            "download the assistant again, or draft without it (--strategy ngram)",
        ) from exc
    head = MlxAssistantHead(target, module, name)
    eval_parameters(module)
    module.eval()
    return head


def _weights(folder: str) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{folder} holds no safetensors", "download the assistant again")
    for path in files:
        tensors = mx.load(path)
        assert isinstance(tensors, dict)
        for key, value in tensors.items():
            key = key.removeprefix("model.").removeprefix("language_model.").removeprefix("model.")
            if not any(part in f".{key}" for part in UNUSED):
                weights[key] = value
    return weights


class MlxAssistantHead(HeadOfTarget[mx.array]):
    """A Gemma 4 assistant as a Backend, so ModelDrafter drafts with it (see the module doc)."""

    _target: MlxTarget
    shared = True

    def __init__(self, target: MlxTarget, module: Gemma4Assistant, name: str) -> None:
        super().__init__(target)
        self._module = module
        inner = text_model(target.model).model
        self._embed, self._scale = inner.embed_tokens, float(inner.embed_scale)
        self._window = int(text_model(target.model).args.sliding_window)
        self._sources = self._cache_sources(inner, name)
        self._states = target.hidden_states()
        size, info = parameter_bytes(module), target.info  # priced by its own size (calibrate.prior_calibration)
        params = info.n_params * size // max(info.size_bytes, 1)
        self.info = replace(info, name=name, size_bytes=size, n_params=params, n_layers=len(module.layers))
        self.capabilities = Capabilities(
            max_block=target.capabilities.max_block,
            device=target.capabilities.device,
            extra={**target.capabilities.extra, "self_draft": "mtp"},
        )

    def _cache_sources(self, inner: Any, name: str) -> dict[str, int]:
        """The target cache each kind of layer reads: the last layer of that kind, after the
        target's KV sharing (llama.cpp's share(): n_layer-2 for sliding, n_layer-1 for full)."""
        sources: dict[str, int] = {}
        for i, layer in enumerate(inner.layers):
            sources[layer.layer_type] = inner.previous_kvs[i]
        for layer in self._module.layers:
            kind = layer.layer_type
            source = sources.get(kind)
            theirs = None if source is None else inner.layers[source].self_attn
            mine = layer.self_attn
            if theirs is None or theirs.head_dim != mine.head_dim or mine.n_heads % theirs.n_kv_heads:
                raise InvalidRequestError(
                    f"{name} does not fit {self._target.info.name}: its {kind} layers' heads do not match the model's",
                    "use the assistant made for this model (E4B with E4B, 12B with 12B, 31B with 31B)",
                )
            layer.self_attn.rope = theirs.rope  # rotated exactly as the keys it reads were
        return sources

    # -- drafting -------------------------------------------------------------------------------

    def _shared_kv(self, at: int, dtype: mx.Dtype) -> dict[str, tuple[mx.array, mx.array]]:
        """Each kind's keys and values of the target at positions before `at` (a sliding
        layer's within its window), which a query at `at` attends to."""
        out: dict[str, tuple[mx.array, mx.array]] = {}
        for kind, index in self._sources.items():
            c = self._target._cache[index]
            keys: mx.array | None
            values: mx.array | None
            if c.keys is None or c.offset == 0:
                keys = values = None
            elif isinstance(c, RotatingKVCache):
                keys = c._temporal_order(c.keys)  # type: ignore[no-untyped-call]
                values = c._temporal_order(c.values)  # type: ignore[no-untyped-call]
                first = int(c.offset) - int(keys.shape[2])  # the position of the oldest entry kept
                lo = max(at - self._window + 1, first) - first
                keys, values = keys[:, :, lo : at - first], values[:, :, lo : at - first]
            else:
                keys, values = c.keys[:, :, :at], c.values[:, :, :at]
            if keys is None or values is None or keys.shape[2] == 0:  # nothing decoded yet: attention adds nothing
                layer = next(m for m in self._module.layers if m.layer_type == kind).self_attn
                keys = values = mx.zeros((1, 1, 1, layer.head_dim), dtype=dtype)
            out[kind] = (keys, values)
        return out

    def _state_before(self, q: int) -> mx.array:
        """h_{q-1}: the target's where it has decoded q-1 with this token, else the assistant's own."""
        if q == 0:
            return mx.zeros((self._states.shape[1],), dtype=mx.float32)  # as llama.cpp starts
        own = self._own.get(q - 1)
        if self._known(q - 1) or own is None:
            return mx.array(self._states[q - 1])
        return own

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        n, past = len(tokens), self._admit(tokens, logits)
        frontier = len(self._target.cached_tokens())
        picked = list(range(n)) if logits == "all" else ([n - 1] if logits == "last" and n else [])
        rows: dict[int, mx.array] = {}
        for k, token in enumerate(tokens):  # the target's cache holds the positions before the frontier
            q = past + k
            if q >= frontier or k in picked:
                rows[k] = self._pass(q, int(token), min(q, frontier))
        if not picked:
            return np.empty((0, self.info.n_vocab), dtype=np.float32)
        out = mx.stack([rows[k] for k in picked]).astype(mx.float32)
        mx.eval(out)
        return np.array(out, copy=True)

    def _pass(self, q: int, token: int, at: int) -> mx.array:
        """The assistant over token x_q, read at position `at`; keeps its h' as position q's."""
        embedded = self._embed(mx.array([[token]], dtype=mx.int32)) * self._scale
        hidden = self._state_before(q).astype(embedded.dtype)[None, None]
        logits, state = self._module(embedded, hidden, self._shared_kv(at, embedded.dtype), at)
        mx.eval(logits, state)
        self._own[q] = state[0, 0].astype(mx.float32)
        out: mx.array = logits[0, 0]
        return out

    def close(self) -> None:
        self._closed = True
        self._own = {}
