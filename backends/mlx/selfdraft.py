"""Self-drafters made in memory from a loaded MLX target (no derived files, no second download).

- qspec[:BITS]: a copy of the target requantized with MLX's affine quantization to 2, 3, 4,
  5, 6 or 8 bits (QSpec-style low-bit drafter). Without BITS: 4 for a target wider than 4
  bits, else 2. Norms and biases are shared with the target, only the matrices are copied.
- layerskip[:L]: the target's first L blocks, then its final norm and head (early exit);
  it shares every weight with the target and has a KV cache of its own. Without L: the exit
  with the best measured agreement × cost (localspec.selfdraft.best_in_memory), cached.

Both are full Backends: the engine drafts with them like with any separate draft model.
"""

from __future__ import annotations

import re
from typing import Any

from mlx.nn.layers.base import Module
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear, quantize

from localspec.errors import InvalidRequestError
from localspec.protocol import Backend
from localspec.selfdraft import best_in_memory, exit_candidates

from .backend import Forward, MlxBackend, eval_parameters, modules_of, parameters_of

QSPEC_BITS = (2, 3, 4, 5, 6, 8)


def make_self_drafter(target: Backend, kind: str, option: str | None) -> Backend:
    """The drafter for strategy f"{kind}:{option}"; its capabilities.extra["self_draft"]
    is the resolved label (e.g. "qspec:2", "layerskip:15")."""
    if not isinstance(target, MlxBackend):
        raise InvalidRequestError(f"in-memory self-drafting needs an MLX target, not {target.info.backend}")
    if kind == "qspec":
        bits = qspec_bits(target.model, option)
        return target.derive(Forward(low_bit_copy(target.model, bits)), f"qspec:{bits}")
    if kind == "layerskip":
        keep = layerskip_blocks(target.forward, option)
        if keep is None:  # no L given: the exit with the best measured agreement × cost
            exits = exit_candidates(target.forward.n_layers)
            return best_in_memory(
                target, kind, exits, lambda k: target.derive(Forward(target.model, int(k)), f"layerskip:{k}")
            )
        return target.derive(Forward(target.model, keep), f"layerskip:{keep}")
    raise InvalidRequestError(f"unknown self-drafting strategy {kind!r}", "choose qspec[:BITS] or layerskip[:L]")


def typical_bits(model: Module) -> int:
    """Bits per weight that most of the model's matrix weights are stored with (16 unquantized)."""
    weights: dict[int, int] = {}
    for _, module in modules_of(model):
        if isinstance(module, QuantizedLinear | QuantizedEmbedding):
            bits = int(module.bits)
            weights[bits] = weights.get(bits, 0) + int(module.weight.size) * 32 // bits
        elif isinstance(module, Linear | Embedding):
            weights[16] = weights.get(16, 0) + int(module.weight.size)
    return max(weights, key=lambda b: weights[b]) if weights else 16


def qspec_bits(model: Module, option: str | None) -> int:
    if option is None:
        return 4 if typical_bits(model) > 4 else 2
    match = re.fullmatch(r"[Qq]?(\d)(?:_.*)?(?:bits?)?", option.strip())
    bits = int(match.group(1)) if match else 0
    if bits not in QSPEC_BITS:
        raise InvalidRequestError(
            f"qspec on MLX takes a bit width, got {option!r}", f"choose one of: {', '.join(map(str, QSPEC_BITS))}"
        )
    return bits


def layerskip_blocks(forward: Forward, option: str | None) -> int | None:
    total = forward.n_layers
    if not forward.split:
        raise InvalidRequestError(
            f"layerskip on MLX needs a llama, qwen2 or qwen3 model; {type(forward.model).__module__} cannot stop early",
            "use --strategy qspec or ngram with this model",
        )
    if option is None:
        return None
    try:
        keep = int(option)
    except ValueError:
        raise InvalidRequestError(f"layerskip takes the number of blocks to keep, got {option!r}") from None
    if not 1 <= keep < total:
        raise InvalidRequestError(f"layerskip:{keep} must keep between 1 and {total - 1} of {total} blocks")
    return keep


def low_bit_copy(model: Module, bits: int) -> Module:
    """model with every quantizable matrix requantized to bits; the rest is shared."""
    from mlx_lm.utils import dequantize_model

    group_size = 32 if bits <= 3 else 64
    model_class: Any = type(model)  # an mlx-lm Model, built from its args
    copy: Module = model_class(model.args)
    packed = {
        path: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
        for path, m in modules_of(model)
        if isinstance(m, QuantizedLinear | QuantizedEmbedding)
    }
    if packed:  # give the copy the target's layout so its weights load as they are
        quantize(copy, class_predicate=lambda path, _m: packed.get(path, False))
    copy.load_weights(parameters_of(model), strict=True)
    for mine, theirs in zip(copy.layers, model.layers, strict=True):
        if hasattr(theirs, "self_attn") and hasattr(theirs.self_attn, "rope"):
            mine.self_attn.rope = theirs.self_attn.rope  # e.g. a GGUF's frequency-factor rope
    dequantize_model(copy)
    quantize(
        copy,
        group_size=group_size,
        bits=bits,
        class_predicate=lambda _p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0,
    )
    for _, module in modules_of(copy):  # one matrix at a time keeps the peak memory low
        if isinstance(module, QuantizedLinear | QuantizedEmbedding):
            eval_parameters(module)
    eval_parameters(copy)
    copy.eval()
    return copy
