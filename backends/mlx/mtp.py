"""Qwen3.5/3.6's own MTP head (one extra decoder block, the mtp.* weights) drafting on MLX.

mlx-lm's qwen3_5 drops the mtp.* weights when it loads a model; they are read here from the
folder's safetensors and run with mlx-lm's own qwen3_5 decoder layer (an attention layer):

    x_q' = fc([pre_fc_norm_embedding(embed(x_q)), pre_fc_norm_hidden(h_{q-1})])
    h_q' = norm(layer(x_q')),   logits = the target's lm_head(h_q')

At position q the head reads the token x_q with the target's final-norm hidden state at
q-1 and predicts x_{q+1} (vLLM's Qwen3-Next MTP and llama.cpp's nextn layer do the same).
Beyond what the target has decoded, its own h_q' stands in for the target's, which is how it
drafts several tokens ahead; once the target has decoded such a position, the position is
read again with the target's state, as backends/llamacpp/mtp.py does on llama.cpp.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.normalization import RMSNorm
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from localspec.core.protocol import Capabilities, Logits, LogitsMode
from localspec.core.records import HeadOfTarget

from .modules import text_model

if TYPE_CHECKING:
    from .modules import MlxTarget

# The norms Qwen3.5's checkpoints store as offsets from one (mlx-lm adds the one when it
# converts a checkpoint; an mlx-lm folder holds them shifted already).
SHIFTED_NORMS = ("norm.weight", "layernorm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


class MtpBlock(Module):
    """The mtp.* weights as a module: fc over [embedding; hidden], one decoder layer, a norm."""

    def __init__(self, text_args: Any) -> None:
        from mlx_lm.models import qwen3_5

        super().__init__()  # type: ignore[no-untyped-call]
        width = text_args.hidden_size
        self.fc = Linear(2 * width, width, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(width, eps=text_args.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(width, eps=text_args.rms_norm_eps)
        # layer_idx interval-1 makes it an attention layer, as the MTP block is.
        self.layers = [qwen3_5.DecoderLayer(text_args, layer_idx=text_args.full_attention_interval - 1)]  # type: ignore[no-untyped-call]
        self.norm = RMSNorm(width, eps=text_args.rms_norm_eps)

    def __call__(self, embedded: mx.array, hidden: mx.array, cache: KVCache) -> mx.array:
        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], axis=-1))
        out: mx.array = self.norm(self.layers[0](x, create_attention_mask(x, cache), cache))
        return out


def mtp_weights(folder: str) -> dict[str, mx.array]:
    """The mtp.* tensors of an mlx-lm or Hugging Face folder, named as in MtpBlock."""
    weights: dict[str, mx.array] = {}
    shifted = True
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        tensors = mx.load(path)
        assert isinstance(tensors, dict)
        for key, value in tensors.items():
            if "mtp." in key:
                weights[key[key.index("mtp.") + 4 :]] = value
            elif key.endswith("conv1d.weight") and value.shape[-1] != 1:
                shifted = False  # a checkpoint mlx-lm has not converted: its norms are offsets
    if not shifted:
        weights = {k: v + 1.0 if k.endswith(SHIFTED_NORMS) and v.ndim == 1 else v for k, v in weights.items()}
    return weights


def mtp_layer_count(folder: str) -> int:
    """How many MTP layers a folder's safetensors keep (mtp.layers.N.*), from their headers only."""
    keys: list[str] = []
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        try:
            with open(path, "rb") as file:
                size = int.from_bytes(file.read(8), "little")
                header = json.loads(file.read(size)) if 0 < size < 1 << 28 else {}
        except (OSError, ValueError):
            continue  # a damaged file: the load that follows says so
        keys += [k for k in header if isinstance(header, dict) and "mtp." in k]
    layers = {m.group(1) for k in keys if (m := re.search(r"mtp\.layers\.(\d+)\.", k))}
    return len(layers) or (1 if keys else 0)


def stack_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """A MoE MTP layer's experts as mlx-lm's SwitchGLU takes them: Hugging Face's fused
    gate_up_proj / down_proj, or one tensor per expert, become switch_mlp.{gate,up,down}_proj."""
    out: dict[str, mx.array] = {}
    per_expert: dict[str, dict[int, mx.array]] = {}
    for key, value in weights.items():
        fused = re.fullmatch(r"(.*\.mlp)\.experts\.(gate_up_proj|down_proj)(\.weight)?", key)
        single = re.fullmatch(r"(.*\.mlp)\.experts\.(\d+)\.(\w+_proj)\.(weight|scales|biases)", key)
        if fused and fused.group(2) == "gate_up_proj":
            gate, up = mx.split(value, 2, axis=-2)
            out[f"{fused.group(1)}.switch_mlp.gate_proj.weight"] = mx.contiguous(gate)
            out[f"{fused.group(1)}.switch_mlp.up_proj.weight"] = mx.contiguous(up)
        elif fused:
            out[f"{fused.group(1)}.switch_mlp.down_proj.weight"] = value
        elif single:
            name = f"{single.group(1)}.switch_mlp.{single.group(3)}.{single.group(4)}"
            per_expert.setdefault(name, {})[int(single.group(2))] = value
        else:
            out[key] = value
    for name, experts in per_expert.items():
        out[name] = mx.stack([experts[e] for e in sorted(experts)])
    return out


class MlxMtpHead(HeadOfTarget[mx.array]):
    """The target's MTP block as a Backend, so ModelDrafter drafts with it (see the module doc)."""

    _target: MlxTarget

    def __init__(self, target: MlxTarget, block: MtpBlock) -> None:
        super().__init__(target)
        self._block = block
        self._states = target.hidden_states()
        self._embed = text_model(target.model).model.embed_tokens
        self._cache = KVCache()  # type: ignore[no-untyped-call]
        layers = max(target.info.n_layers, 1)
        info = target.info  # one block of the target's, priced as such (calibrate.prior_calibration)
        self.info = replace(
            info, name=f"{info.name} [mtp]", size_bytes=info.size_bytes // layers, n_params=info.n_params // layers
        )
        self.capabilities = Capabilities(
            max_block=target.capabilities.max_block,
            device=target.capabilities.device,
            extra={**target.capabilities.extra, "self_draft": "mtp"},
        )

    # -- drafting -------------------------------------------------------------------------------

    def _state_before(self, q: int) -> mx.array:
        """h_{q-1}, the state x_q is read with: the target's where it has one, else the head's own."""
        if q == 0:
            self._guessed.discard(q)
            return mx.zeros((self._states.shape[1],), dtype=mx.float32)  # as llama.cpp starts
        own = self._own.get(q - 1)
        if self._known(q - 1) or own is None:
            self._guessed.discard(q)
            return mx.array(self._states[q - 1])
        self._guessed.add(q)
        return own

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        n, past = len(tokens), self._admit(tokens, logits)
        frontier = len(self._target.cached_tokens())
        rows: list[mx.array] = []
        k = 0
        while k < n:  # positions whose state before is the target's go in one pass, the rest one by one
            end = max(k + 1, min(n, frontier + 1 - past))
            rows.append(self._pass(past + k, tokens[k:end]))
            k = end
        picked = range(n) if logits == "all" else ([n - 1] if logits == "last" else [])
        if not picked:
            return np.empty((0, self.info.n_vocab), dtype=np.float32)
        hidden = mx.concatenate(rows, axis=0)[mx.array(list(picked))]
        out = self._target.forward.head(hidden[None])[0].astype(mx.float32)
        mx.eval(out)
        return np.array(out, copy=True)

    def _pass(self, start: int, tokens: Sequence[int]) -> mx.array:
        """The block over tokens at positions start..; keeps its outputs as the head's own states."""
        hidden = mx.stack([self._state_before(start + k) for k in range(len(tokens))])[None]
        embedded = self._embed(mx.array([list(tokens)], dtype=mx.int32))
        out = self._block(embedded, hidden.astype(embedded.dtype), self._cache)[0]
        mx.eval(out, self._cache.keys, self._cache.values)
        for k in range(len(tokens)):
            self._own[start + k] = out[k]
        return out

    def _forget(self, position: int) -> None:
        self._cache.trim(self._cache.offset - position)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._closed = True
        self._cache = KVCache()  # type: ignore[no-untyped-call]
        self._own = {}
